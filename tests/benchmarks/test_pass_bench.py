"""`python -m benchmarks.pass_bench`: every artifact, variant and past takes turns in one run."""

from __future__ import annotations

from click.testing import CliRunner

from benchmarks import pass_bench


def test_every_variant_and_past_gets_a_row_and_each_pass_is_timed(artifact):
    folder = artifact("llama")
    out = CliRunner().invoke(
        pass_bench.main, [str(folder), "--windows", "1,3", "--pasts", "0,9", "--repeats", "2", "--threads", "1"]
    )
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| inplace") or line.startswith("| portable")]
    assert sorted(r.split("|")[1:3] for r in rows) == [
        [" inplace ", " 0 "],
        [" inplace ", " 9 "],
        [" portable ", " 0 "],
        [" portable ", " 9 "],
    ]
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
    samples = pass_bench.time_passes(
        {"a": Context("a"), ("b", 4): Context("b")}, 2, repeats=3, clock=lambda: next(ticks)
    )
    assert calls == [("a", 2), ("b", 2)] * 4  # alternating, one warm-up turn
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, ("b", 4): 3}


def test_two_artifacts_with_the_same_folder_name_stay_apart(artifact, tmp_path):
    import shutil

    folder = artifact("llama")
    twin = tmp_path / "x" / folder.name
    shutil.copytree(folder, twin)
    out = CliRunner().invoke(
        pass_bench.main,
        [
            str(folder),
            str(twin),
            "--windows",
            "1",
            "--pasts",
            "0",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--graph",
            "inplace",
        ],
    )
    assert out.exit_code == 0, out.output
    assert f"| {folder}/inplace |" in out.output and f"| {twin}/inplace |" in out.output


def test_floor_prints_each_cells_bytes_over_the_measured_bandwidth(artifact):
    folder = artifact("llama")
    out = CliRunner().invoke(
        pass_bench.main,
        [str(folder), "--windows", "1,4", "--pasts", "0,9", "--repeats", "1", "--threads", "1", "--floor"],
    )
    assert out.exit_code == 0, out.output
    floor = out.output.split("memory floor")[1]
    rows = [
        line.split("|")[1:-1]
        for line in floor.splitlines()
        if line.startswith("| inplace") or line.startswith("| portable")
    ]
    assert sorted((r[0].strip(), r[2].strip()) for r in rows) == [
        ("inplace", "0"),
        ("inplace", "9"),
        ("portable", "0"),
        ("portable", "9"),
    ]
    for r in rows:
        assert all(cell.strip().endswith("x)") for cell in r[3:])  # floor ms (measured / floor)
        assert float(r[1]) > 0  # the graph file's megabytes


def test_pass_bytes_are_the_weights_and_the_kv_entries_the_graph_touches(artifact):
    import numpy as np

    from jacobi_rt.runtime.manifest import load_manifest

    manifest = load_manifest(artifact("llama"), verify=False)
    arch = manifest.architecture
    entry = (
        2 * arch.num_layers * arch.kv_heads * arch.head_dim * np.dtype(manifest.dtype).itemsize
    )  # key + value, every layer
    assert pass_bench.pass_bytes(1000, manifest, "inplace", 10, 2) == 1000 + 12 * entry
    assert (
        pass_bench.pass_bytes(1000, manifest, "portable", 10, 2) == 1000 + 24 * entry
    )  # reads the past, writes the present
    assert (
        pass_bench.pass_bytes(1000, manifest, "inplace", 10, 2, rows=3) == 1000 + 36 * entry
    )  # weights once, KV per row


def test_read_bandwidth_is_a_rate():
    assert pass_bench.read_bandwidth(threads=2, megabytes=8, repeats=1) > 1e8  # bytes per second
