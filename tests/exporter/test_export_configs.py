"""Configs that used to end in a traceback: each exports and matches PyTorch, or is refused before
tracing with the field and value that stop it.

- `rope_scaling` type `dynamic`: torch.export failed on its data-dependent growth branch; inside
  the model's positions that branch never runs, so the static one is traced.
- a head size that is not a multiple of 16: onnxruntime's GroupQueryAttention refuses it, so the
  in-place graph uses the scatter form, and the manifest says so.
- a Mistral `sliding_window` shorter than the check's longest past: the check's shapes fit inside
  the exported context, and `max_context` messages name the window.
- `longrope` (the tiny Phi-3's): the context stays below `original_max_position_embeddings` (past
  it the model switches factors mid-sequence), with the short factors traced.
"""

from __future__ import annotations

import json
import os

import pytest
from export_helpers import assert_generation_is_greedy

from jacobi_rt.runtime.errors import ModelSourceError, OptionError

PROMPT = [5, 17, 33, 90, 5, 17]


def llama(**fields):
    from tiny_models import VOCAB
    from transformers import LlamaConfig

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=0,
    )
    return LlamaConfig(**{**common, **fields})


def configs():
    from tiny_models import VOCAB
    from transformers import MistralConfig

    return {
        # head_dim 8 with dynamic NTK rope (a Llama-2 fine-tune's `{"type": "dynamic", "factor": 2.0}`)
        "dynamic-head8": llama(num_attention_heads=8, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        "mistral-window16": MistralConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            sliding_window=16,
            eos_token_id=0,
            bos_token_id=None,
            pad_token_id=0,
        ),
    }


@pytest.fixture(scope="module")
def case(tmp_path_factory, hf_model):
    """case(name) -> (model folder, artifact folder, manifest), one export per config per module."""
    from tiny_models import save_tiny_model

    from jacobi_rt.exporter import export

    root = tmp_path_factory.mktemp("configs")
    done = {}

    def get(name: str):
        if name not in done:
            folder = save_tiny_model(configs()[name], root / name)
            done[name] = (folder, root / f"{name}-artifact", export(str(folder), root / f"{name}-artifact"))
        return done[name]

    return get


def assert_checked(manifest) -> None:
    for check in (manifest.check["vs_pytorch"], manifest.check["inplace"]):
        assert check["agreement"] == 1.0 and check["max_logit_diff"] <= check["tolerance"]


def test_dynamic_rope_with_a_head_size_gqa_cannot_take(case, hf_model):
    folder, artifact, manifest = case("dynamic-head8")
    assert manifest.architecture.head_dim == 8
    assert manifest.check["inplace"]["attention"] == "scatter"  # GroupQueryAttention needs a multiple of 16
    assert not manifest.attention_extra_row  # no GroupQueryAttention to give the extra row (gqa_rows.py)
    assert manifest.max_context == 256
    assert_checked(manifest)
    assert_generation_is_greedy(artifact, hf_model(folder), PROMPT, 24)


def test_a_sliding_window_shorter_than_the_checks_past(case, hf_model):
    folder, artifact, manifest = case("mistral-window16")
    assert manifest.max_context == 16
    assert_checked(manifest)
    assert max(s["past"] + s["window"] for s in manifest.check["vs_pytorch"]["shapes"]) == 16
    assert_generation_is_greedy(artifact, hf_model(folder), PROMPT, 10)


def test_max_context_beyond_a_sliding_window_names_the_window(case, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    folder, _, _ = case("mistral-window16")
    with pytest.raises(OptionError) as info:
        export(str(folder), tmp_path / "out", ExportOptions(max_context=64))
    message = str(info.value)
    assert "`max_context`" in message and "sliding window of 16" in message and "64" in message
    assert "256" not in message  # not the positions, which are not what stops it
    assert "`" not in info.value.naming(lambda parameter: "--max-context")  # what the command line prints
    assert not (tmp_path / "out").exists()


def test_longrope_exports_its_short_factors_below_the_switch(tiny_artifact):
    phi3 = tiny_artifact("phi3")  # Phi-4-mini's longrope, shrunk (test_export_families.py generates with it)
    assert phi3.manifest.max_context == 128  # original_max_position_embeddings, below the 256 positions
    assert phi3.manifest.check["inplace"]["attention"] == "gqa"
    assert_checked(phi3.manifest)


def test_longrope_context_past_the_switch_is_refused_before_loading(tiny_model, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_model("phi3") / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(os.urandom(64))  # reaching the weights would fail differently
    with pytest.raises(OptionError) as info:
        export(str(broken), tmp_path / "out", ExportOptions(max_context=200))
    message = str(info.value)
    assert "`max_context`" in message and "original_max_position_embeddings" in message and "128" in message
    assert not (tmp_path / "out").exists()


def test_an_unknown_rope_type_is_refused_before_loading(tmp_path):
    from jacobi_rt.exporter import export

    folder = tmp_path / "model"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "max_position_embeddings": 256,
        "rope_scaling": {"rope_type": "su-mystery", "factor": 2.0},
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(os.urandom(64))
    with pytest.raises(ModelSourceError) as info:
        export(str(folder), tmp_path / "out")
    message = str(info.value)
    assert "rope_scaling type 'su-mystery'" in message and "longrope" in message
    assert not (tmp_path / "out").exists()


def test_alibi_falcon_is_refused_before_loading(tmp_path):
    """Falcon-RW's ALiBi biases have no place in the graphs; rotary Falcons export (test_export_families.py)."""
    from jacobi_rt.exporter import export

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "falcon", "alibi": True, "max_position_embeddings": 2048})
    )
    (folder / "model.safetensors").write_bytes(os.urandom(64))
    with pytest.raises(ModelSourceError) as info:
        export(str(folder), tmp_path / "out")
    assert "alibi true" in str(info.value) and not (tmp_path / "out").exists()


def test_context_limits_from_config_fields():
    from jacobi_rt.exporter.limits import context_limit

    assert context_limit({"max_position_embeddings": 512, "sliding_window": 64}).positions == 64
    assert (
        context_limit({"max_position_embeddings": 512, "sliding_window": 64, "use_sliding_window": False}).positions
        == 512
    )
    # Gemma 3: local layers' window, global layers' own rope; a window in no layer does not limit
    gemma3 = {
        "max_position_embeddings": 512,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0},
            "sliding_attention": {"rope_type": "default"},
        },
    }
    assert context_limit(gemma3).positions == 32
    assert context_limit({**gemma3, "layer_types": ["full_attention"] * 2}).positions == 512
    assert "positions" in context_limit({"n_positions": 128}).why
    assert context_limit({}) is None
