"""GroupQueryAttention with one extra query row (exporter/attention/gqa_rows.py): float and level-4 graphs.

A tiny Llama GGUF exported at accuracy level 4: the in-place graph's attention nodes get the extra
row, the manifest says so, a window that ends at the context's capacity still fits (the spare
entry), and a chain window's rows are bitwise one-token passes. Every tiny family's float export
has the row too (its in-place check ran on the graph with it), so no one-token pass is padded;
level 0 has none. The real model's check (where the unpadded graph fails it) is in
test_export_smollm2_gguf.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("gguf", reason="GGUF sources need the `gguf` package: pip install 'jacobi-rt[export]'")

from chain_windows import window_and_one_token_passes  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def level4(artifact):
    """(folder, manifest) of the tiny Q4_1 GGUF on its own blocks at level 4 (make_artifacts.TINY_GGUF: CI's
    prebuilt one, else exported once by tests/conftest.py's `artifact`)."""
    from make_artifacts import TINY_GGUF

    from jacobi_rt.runtime.manifest import load_manifest

    folder = artifact(TINY_GGUF)
    return folder, load_manifest(folder)


def attention_nodes_with_the_row(folder, manifest) -> tuple[int, int]:
    """(GroupQueryAttention nodes, those whose query is padded and whose output is sliced) of the in-place graph."""
    graph = onnx.load(str(folder / manifest.graphs["inplace"]), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    consumer = {i: n for n in graph.node for i in n.input}
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    padded = [
        n for n in attention if producer[n.input[0]].op_type == "Pad" and consumer[n.output[0]].op_type == "Slice"
    ]
    return len(attention), len(padded)


def test_every_attention_node_reads_one_more_row(level4):
    folder, manifest = level4
    assert manifest.check["weights"]["attention_extra_row"] is True and manifest.attention_extra_row
    graph = onnx.load(str(folder / manifest.graphs["inplace"])).graph
    producer = {o: n for n in graph.node for o in n.output}
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert attention and attention_nodes_with_the_row(folder, manifest) == (len(attention), len(attention))
    for node in attention:
        assert all(producer[node.input[i]].op_type == "Pad" for i in (0, 9, 10))  # q|k|v packed, positions, bias
        assert list(node.input[1:3]) == ["", ""]


def test_a_float_export_gives_its_attention_the_row(exported):
    """The in-place trace pads the float graph's attention (gqa_rows.wanted(None)), once, before its check."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    manifest = exported.manifest
    assert manifest.check["inplace"]["attention"] == "gqa"  # every tiny family's head size is a multiple of 16
    nodes, padded = attention_nodes_with_the_row(exported.artifact, manifest)
    assert nodes == padded == manifest.architecture.num_layers
    assert manifest.check["inplace"]["extra_row"] is True and manifest.attention_extra_row
    backend = OrtBackend(exported.artifact, manifest, device="cpu", threads=1, graph="inplace")
    assert backend.extra_row and backend.spare_entries >= 1
    assert backend.rows.mode in ("native", "padded")


def test_padding_twice_adds_nothing(exported):
    """The weight pass of a `graphs_from` export meets a float graph that has the row: it keeps it as it is."""
    from jacobi_rt.exporter.attention.gqa_rows import pad_attention_rows

    manifest = exported.manifest
    assert manifest.check["inplace"]["attention"] == "gqa"  # every tiny family's head size is a multiple of 16
    model = onnx.load(str(exported.artifact / manifest.graphs["inplace"]), load_external_data=False)
    before = [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert pad_attention_rows(model) == manifest.architecture.num_layers
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == before


@pytest.fixture(scope="module")
def level0(tmp_path_factory):
    from jacobi_rt.exporter import ExportOptions, export

    root = tmp_path_factory.mktemp("level0")
    manifest = export(
        str(write_tiny_gguf(root / "tiny.gguf", "Q4_0")), root / "out", ExportOptions(weights="gguf", accuracy_level=0)
    )
    return root / "out", manifest


def test_level_0_keeps_the_one_row_path(level0):
    folder, manifest = level0
    assert manifest.check["weights"]["attention_extra_row"] is False and not manifest.attention_extra_row
    graph = onnx.load(str(folder / manifest.graphs["inplace"])).graph
    assert not any(n.op_type == "Pad" for n in graph.node)


@pytest.mark.parametrize("graph", ["inplace", "portable"])
def test_level_0_windows_equal_greedy_in_the_mode_the_check_picks(level0, graph):
    """Float activations through MatMulNBits (level 0) still take a one-row kernel of their own for a
    one-row pass (SQ4BitGemmM1Kernel_CompFp32, on x86-64 whatever its vector width): the load-time
    check (runtime/backends/exact_rows.py) finds it and pads, and every strategy equals greedy."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder, manifest = level0
    backend = OrtBackend(folder, manifest, device="cpu", threads=2, graph=graph)
    assert backend.rows.mode in ("native", "padded")
    generator = Generator(backend, Tokenizer(folder, manifest))
    prompt = list(range(5, 17))
    greedy = generator.generate(prompt, max_new_tokens=24, strategy="greedy").ids
    for strategy in ("jacobi", "lookahead"):
        assert generator.generate(prompt, max_new_tokens=24, strategy=strategy).ids == greedy, strategy


def test_a_window_may_end_at_the_capacity(level4):
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    folder, manifest = level4
    assert OrtBackend(folder, manifest, device="cpu", threads=1).graph == "inplace"  # auto: exact with the extra row
    backend = OrtBackend(folder, manifest, device="cpu", threads=1, graph="inplace")
    assert not backend.limits.branches
    with backend.context(10) as ctx:
        ctx.forward(np.arange(3, 9)[None])
        ctx.commit(6)
        ctx.forward(np.arange(10, 14)[None])  # 6 + 4 = the capacity: the extra row lands in the spare entry
        ctx.commit(4)
        assert ctx.length == 10


def test_a_chain_window_is_bitwise_one_token_passes(level4):
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    folder, manifest = level4
    backend = OrtBackend(folder, manifest, device="cpu", threads=1, graph="inplace")
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, manifest.architecture.vocab_size, 9)
    for width in (2, 5, 8):
        tokens = rng.integers(3, manifest.architecture.vocab_size, width)
        with backend.context(32) as ctx:
            ctx.forward(prompt[None])
            ctx.commit(len(prompt))
            window, alone = window_and_one_token_passes(ctx, tokens)
        assert np.array_equal(window, alone), f"window {width}"
