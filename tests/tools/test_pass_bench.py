"""`python -m jacobi_rt.tools.pass_bench`: every artifact, variant and past takes turns in one run."""

from __future__ import annotations

from click.testing import CliRunner

from jacobi_rt.tools import pass_bench


def test_every_variant_and_past_gets_a_row_and_each_pass_is_timed(artifact):
    folder = artifact("llama")
    out = CliRunner().invoke(pass_bench.main, [str(folder), "--windows", "1,3", "--pasts", "0,9", "--repeats", "2", "--threads", "1"])
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| inplace") or line.startswith("| portable")]
    assert sorted(r.split("|")[1:3] for r in rows) == [[" inplace ", " 0 "], [" inplace ", " 9 "], [" portable ", " 0 "], [" portable ", " 9 "]]
    assert all(len(r.split("|")) == 6 for r in rows)  # graph, past, W=1, W=3


def test_time_passes_takes_turns_and_drops_the_warmup():
    calls = []

    class Context:
        batch = 1

        def __init__(self, name):
            self.name = name

        def forward(self, ids):
            calls.append((self.name, ids.shape[1]))

        def commit(self, n):
            assert n == 0

    ticks = iter(range(100))
    samples = pass_bench.time_passes({"a": Context("a"), ("b", 4): Context("b")}, 2, repeats=3, clock=lambda: next(ticks))
    assert calls == [("a", 2), ("b", 2)] * 4  # alternating, one warm-up turn
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, ("b", 4): 3}


def test_two_artifacts_with_the_same_folder_name_stay_apart(artifact, tmp_path):
    import shutil

    folder = artifact("llama")
    twin = tmp_path / "x" / folder.name
    shutil.copytree(folder, twin)
    out = CliRunner().invoke(pass_bench.main, [str(folder), str(twin), "--windows", "1", "--pasts", "0", "--repeats", "1",
                                               "--threads", "1", "--graph", "inplace"])
    assert out.exit_code == 0, out.output
    assert f"| {folder}/inplace |" in out.output and f"| {twin}/inplace |" in out.output
