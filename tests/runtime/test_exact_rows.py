"""Exact on every CPU (runtime/backends/exact_rows.py): the load-time check, the pad row, the fallback.

What the runtime promises is checked on the machine that runs the tests: whatever mode the check
picks here, every strategy equals greedy decoding. The pad row is checked to leave the real rows
bitwise alone (forced on a CPU that does not need it), and the AVX2-only CPU whose one-row kernel
differs is emulated (qemu-user's `-cpu Haswell`: AVX2 and FMA, no AVX-512), so that CI checks it
whatever CPU it runs on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from chain_windows import window_and_one_token_passes
from make_artifacts import TINY_GGUF

from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.backends import exact_rows
from jacobi_rt.runtime.backends.exact_rows import GREEDY, NATIVE, PADDED, UNCHECKED, RowsCheck
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.manifest import load_manifest

STRATEGIES = ("jacobi", "lookahead", "auto")
PROMPT = list(range(3, 14))


def backend(folder, graph: str = "auto", threads: int = 2) -> OrtBackend:
    return OrtBackend(folder, load_manifest(folder, verify=False), device="cpu", threads=threads, graph=graph)


def test_a_pass_is_padded_at_width_one_or_at_one_more_than_a_multiple_of_128_tokens():
    assert all(exact_rows.needs_pad(r, w) for r, w in [(1, 1), (2, 1), (8, 1), (1, 129), (3, 43)])
    assert not any(exact_rows.needs_pad(r, w) for r, w in [(1, 2), (2, 2), (1, 128), (4, 16), (1, 130)])


def test_with_the_extra_attention_row_only_a_one_row_tile_is_padded():
    """The attention never runs one row there, so greedy rows side by side (width 1) run as they come."""
    assert all(exact_rows.needs_pad(r, w, extra_row=True) for r, w in [(1, 1), (1, 129), (3, 43), (129, 1)])
    assert not any(exact_rows.needs_pad(r, w, extra_row=True) for r, w in [(2, 1), (16, 1), (1, 2), (128, 1)])


def test_the_pad_column_repeats_the_last_token_and_no_real_row_sees_it():
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    positions = np.array([[4, 5, 6], [9, 10, 11]])
    mask = np.tril(np.ones((3, 3), dtype=bool))[None].repeat(2, 0)
    mask[1, 2, 0] = False  # a branch-like mask: the pad row copies nothing of it but its row's own column
    ids2, positions2, mask2 = exact_rows.pad(ids, positions, mask)
    assert ids2.tolist() == [[5, 6, 7, 7], [8, 9, 10, 10]]
    assert positions2.tolist() == [[4, 5, 6, 6], [9, 10, 11, 11]]  # no position past the window's last
    assert np.array_equal(mask2[:, :3, :3], mask) and not mask2[:, :3, 3].any()
    assert mask2[:, 3].all()


@pytest.mark.parametrize("name", [TINY_GGUF, "llama"])  # int8 activations; float32
@pytest.mark.parametrize("graph", ["inplace", "portable"])
def test_the_check_picks_an_exact_mode_and_every_strategy_equals_greedy(artifact, graph, name):
    generator = Generator(backend(artifact(name), graph), _tokenizer(artifact(name)))
    assert generator.backend.rows.mode in (NATIVE, PADDED)  # an exact mode exists on every CPU checked so far
    assert generator.backend.pad_rows == (generator.backend.rows.mode == PADDED)
    greedy = generator.generate(PROMPT, max_new_tokens=32, strategy="greedy")
    assert greedy.stats.exactness == generator.backend.rows.mode
    for strategy in STRATEGIES:
        assert generator.generate(PROMPT, max_new_tokens=32, strategy=strategy).ids == greedy.ids, strategy


@pytest.mark.parametrize("graph", ["inplace", "portable"])
def test_the_pad_row_leaves_the_real_rows_bitwise_alone(artifact, graph):
    """Forced on: a one-token pass runs as two rows and must give the bits it gives alone on a CPU that
    needs no padding, and a chain window's rows must still be those one-token passes."""
    folder = artifact(TINY_GGUF)
    plain, padded = backend(folder, graph), backend(folder, graph)
    padded.pad_rows = True
    tokens = np.arange(40, 52)
    with plain.context(32) as a, padded.context(32) as b:
        for ctx in (a, b):
            ctx.forward(tokens[None, :6])
            ctx.commit(6)
        window, alone = window_and_one_token_passes(b, tokens[6:])
        assert np.array_equal(window, alone)
        assert b.padding == 1 and b.length == 6  # the last one-token pass was padded; nothing of the pad is kept
        if plain.rows.mode == NATIVE:  # this CPU's one-row path is the many-row path: the pad changes nothing
            _, plain_alone = window_and_one_token_passes(a, tokens[6:])
            assert np.array_equal(plain_alone, alone)


def test_a_padded_window_may_end_at_the_capacity(artifact):
    for graph in ("inplace", "portable"):
        padded = backend(artifact(TINY_GGUF), graph)
        padded.pad_rows = True
        with padded.context(8) as ctx:
            ctx.forward(np.arange(3, 10)[None])
            ctx.commit(7)
            out = ctx.forward(np.array([[11]]), want_logits=True)  # 7 + 1 = the capacity; the pad lands past it
            ctx.commit(1)
            assert ctx.padding == 1 and ctx.length == 8 and out.logits.shape[1] == 1 and out.greedy_ids.shape == (1, 1)


def test_batch_rows_with_a_pad_equal_their_solo_runs(artifact):
    """The batch engine's passes are padded too when rows x window leaves one row: each row's output
    still equals its solo greedy output."""
    folder = artifact(TINY_GGUF)
    generator = Generator(backend(folder, "inplace"), _tokenizer(folder))
    generator.backend.pad_rows = True
    prompts = [PROMPT, [7, 8, 9], list(range(20, 41))]
    solo = [generator.generate(p, max_new_tokens=24, strategy="greedy").ids for p in prompts]
    for strategy in ("greedy", "lookahead"):
        batch = generator.generate_batch(prompts, max_new_tokens=24, strategy=strategy)
        assert [r.ids for r in batch] == solo, strategy


def test_with_no_exact_mode_every_strategy_decodes_greedily_and_says_so(artifact, caplog):
    folder = artifact(TINY_GGUF)
    loaded = backend(folder)
    loaded.rows = RowsCheck(GREEDY, 0.01)
    with caplog.at_level(logging.WARNING, logger="jacobi_rt"):
        generator = Generator(loaded, _tokenizer(folder))
    assert [r.getMessage() for r in caplog.records] == [f"{loaded.rows.line()} ({generator.manifest.source['name']})"]
    greedy = generator.generate(PROMPT, max_new_tokens=16, strategy="greedy").ids
    for strategy in STRATEGIES:
        result = generator.generate(PROMPT, max_new_tokens=16, strategy=strategy, window=4)
        assert result.ids == greedy
        assert (result.stats.strategy, result.stats.window, result.stats.exactness) == ("greedy", 1, GREEDY)
        assert result.stats.tokens_per_pass == 1.0


def test_the_mode_is_reported_by_the_cli_and_the_server(artifact):
    from click.testing import CliRunner

    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings
    from jacobi_rt.tools.cli.main import cli

    folder = artifact(TINY_GGUF)
    loaded = backend(folder)
    result = CliRunner().invoke(
        cli, ["generate", str(folder), "--prompt", "hello", "-n", "4", "--verbose", "--threads", "2"]
    )
    assert result.exit_code == 0, result.output
    assert f"exactness: {loaded.rows.mode}: " in result.stderr and exact_rows.cpu() in result.stderr
    httpx = pytest.importorskip("httpx", reason="the server test needs httpx: pip install httpx")
    with BackgroundServer(Generator(loaded, _tokenizer(folder)), ServerSettings(model_id="tiny")) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            card = client.get("/v1/models").json()["data"][0]
    assert card["jacobi"]["exactness"] == loaded.rows.mode


@pytest.mark.parametrize("name", [TINY_GGUF, "llama"])
def test_rows_of_a_width_one_pass_are_a_windows_rows_in_the_checked_mode(artifact, name):
    """The check runs one row; the batcher's passes run many. In the mode the check picked, each row of a
    two-row pass of width 1 (greedy rows side by side) is bitwise that row's one-token pass inside a
    chain window: MLAS's one-row attention and GroupQueryAttention's one-token path are padded away
    for every row, not only for a row alone."""
    loaded = backend(artifact(name), "inplace")
    assert loaded.rows.mode in (NATIVE, PADDED)
    prompts, chain = np.array([[3, 4, 5, 6], [7, 8, 9, 10]]), np.array([[11, 12, 13], [14, 15, 16]])
    with loaded.context(16, batch=2) as ctx:
        ctx.forward(prompts)
        ctx.commit(prompts.shape[1])
        windows = ctx.forward(chain, want_logits=True).logits
        ctx.commit(0)
        for column in range(chain.shape[1]):
            step = ctx.forward(chain[:, column : column + 1], want_logits=True).logits[:, 0]
            ctx.commit(1)
            assert np.array_equal(step, windows[:, column]), f"column {column}"


def test_float_targets_are_checked_and_drafts_are_not(artifact):
    assert backend(artifact("llama")).rows.mode in (NATIVE, PADDED)
    draft = backend(artifact("llama-draft1"))
    assert draft.rows == RowsCheck(UNCHECKED) and not draft.pad_rows


@pytest.mark.slow
def test_an_avx2_only_cpu_pads_one_row_passes(artifact, tmp_path):
    """On an emulated AVX2-only CPU (qemu-user, -cpu Haswell), the check finds that one-row passes are not
    exact as they come and picks the padded mode; every strategy then equals greedy on both graphs."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or os.uname().machine != "x86_64":
        pytest.skip("qemu-user is not installed (apt-get install qemu-user): it emulates the AVX2-only x86-64 CPU")
    folder = artifact(TINY_GGUF)
    script = textwrap.dedent(f"""
        import json
        import numpy as np
        from jacobi_rt.runtime import Generator
        from jacobi_rt.runtime.backends.exact_rows import _window_is_one_token_passes
        from jacobi_rt.runtime.backends.onnxrt import OrtBackend
        from jacobi_rt.runtime.manifest import load_manifest
        from jacobi_rt.runtime.tokenizer import Tokenizer

        folder = {str(folder)!r}
        manifest = load_manifest(folder, verify=False)
        out = {{}}
        for graph in ("inplace", "portable"):
            loaded = OrtBackend(folder, manifest, device="cpu", threads=2, graph=graph)
            generator = Generator(loaded, Tokenizer(folder, manifest))
            greedy = generator.generate({PROMPT}, max_new_tokens=24, strategy="greedy").ids
            same = [generator.generate({PROMPT}, max_new_tokens=24, strategy=s).ids == greedy for s in {STRATEGIES}]
            batch = generator.generate_batch([{PROMPT}, [7, 8, 9]], max_new_tokens=24, strategy="greedy")
            solo = generator.generate([7, 8, 9], max_new_tokens=24, strategy="greedy").ids
            batched = [r.ids for r in batch] == [greedy, solo]  # greedy rows side by side: width-1 passes of 2 rows
            loaded.pad_rows = False
            native = _window_is_one_token_passes(loaded, np.arange(40, 51))
            out[graph] = {{"mode": loaded.rows.mode, "same": same, "batched": batched, "native_exact": native}}
        print(json.dumps(out))
    """)
    run = subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, "-c", script], capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for graph in ("inplace", "portable"):
        expected = {"mode": PADDED, "same": [True] * len(STRATEGIES), "batched": True, "native_exact": False}
        assert found[graph] == expected, (graph, found)


def _tokenizer(folder):
    from jacobi_rt.runtime.tokenizer import Tokenizer

    return Tokenizer(folder, load_manifest(folder, verify=False))


def test_the_verdict_is_kept_for_the_next_load_of_the_same_files_cpu_and_threads(artifact, tmp_path, monkeypatch):
    """The second load reads the first one's verdict (no check passes); other threads, another graph or
    other file digests are other keys; an unreadable verdict file is checked again."""
    from jacobi_rt.runtime.backends.exact_rows import verdict_path

    monkeypatch.setenv("JACOBI_RT_CACHE", str(tmp_path))
    first = Generator.load(artifact("llama"), graph="portable", threads=1)
    assert not first.backend.rows.cached and first.backend.rows.seconds > 0
    again = Generator.load(artifact("llama"), graph="portable", threads=1)
    assert again.backend.rows.cached and again.backend.rows.mode == first.backend.rows.mode
    assert again.backend.pad_rows == first.backend.pad_rows and "earlier load" in again.backend.rows.line()
    assert again.generate("hi", max_new_tokens=6).ids == first.generate("hi", max_new_tokens=6).ids
    path = verdict_path(again.backend)
    assert path.parent == tmp_path / "exact-rows" and path.exists()
    assert not Generator.load(artifact("llama"), graph="portable", threads=2).backend.rows.cached
    assert not Generator.load(artifact("llama"), graph="inplace", threads=1).backend.rows.cached
    path.write_text("{not json")
    assert not Generator.load(artifact("llama"), graph="portable", threads=1).backend.rows.cached
    monkeypatch.setenv("JACOBI_RT_CACHE", "off")
    assert verdict_path(again.backend) is None
    assert not Generator.load(artifact("llama"), graph="portable", threads=1).backend.rows.cached
