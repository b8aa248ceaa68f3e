"""jacobi.json as export writes it: complete, equal to the HF config, and honest about its files."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from export_helpers import sha256
from tiny_models import other_tokenizer

HEX64 = re.compile(r"[0-9a-f]{64}")


def expected_architecture(config) -> dict:
    heads = config.num_attention_heads
    return {
        "family": config.model_type,
        "num_layers": config.num_hidden_layers,
        "num_heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "max_positions": config.max_position_embeddings,
    }


def test_manifest_complete(exported):
    from transformers import AutoConfig, AutoTokenizer

    from jacobi_rt.runtime.manifest import load_manifest

    raw = json.loads((exported.artifact / "jacobi.json").read_text())
    manifest = load_manifest(exported.artifact, verify=True)  # the runtime's own reading, files hashed
    assert manifest == exported.manifest
    assert raw["format_version"] == 1
    assert raw["role"] == "target" and raw["dtype"] == "float32" and raw["opset"] == 18 and raw["quantization"] is None

    config = AutoConfig.from_pretrained(exported.model_dir)
    assert raw["architecture"] == expected_architecture(config)
    assert raw["max_context"] == config.max_position_embeddings

    source = raw["source"]
    assert source["kind"] == "hf-folder" and source["model_type"] == config.model_type
    assert HEX64.fullmatch(source["sha256"])

    tokenizer = AutoTokenizer.from_pretrained(exported.model_dir)
    assert tokenizer.eos_token_id in raw["tokens"]["eos_ids"]
    assert config.eos_token_id in raw["tokens"]["eos_ids"]
    assert raw["tokens"]["pad_id"] == tokenizer.pad_token_id
    assert raw["tokens"]["bos_id"] == tokenizer.bos_token_id

    assert raw["graphs"]["portable"] == "model.onnx"
    tok = raw["tokenizer"]
    assert tok["file"] == "tokenizer.json" and HEX64.fullmatch(tok["vocab_sha256"])
    assert tok["chat_template"] == "chat_template.jinja"
    assert tok["eos_token"] == tokenizer.eos_token
    assert (exported.artifact / "chat_template.jinja").read_text() == tokenizer.chat_template

    assert raw["created"]["tool"].startswith("jacobi-rt ")
    assert raw["created"]["export_seconds"] >= 0


def test_files_recorded_with_their_sha256(exported):
    files = exported.manifest.files
    on_disk = {p.name for p in exported.artifact.iterdir() if p.is_file()} - {"jacobi.json"}
    assert set(files) == on_disk
    assert {"model.onnx", "tokenizer.json", "chat_template.jinja"} <= on_disk
    for name, digest in files.items():
        assert sha256(exported.artifact / name) == digest, name
    # every graph the manifest names is a recorded file
    assert set(exported.manifest.graphs.values()) <= set(files)


def test_check_figures(exported):
    report = exported.manifest.check["vs_pytorch"]
    assert 0 <= report["max_logit_diff"] < report["tolerance"] <= 2e-3
    assert report["max_present_diff"] >= 0
    assert report["positions"] > 0 and report["greedy_agree"] == report["positions"] and report["agreement"] == 1.0
    shapes = {(s["batch"], s["window"], s["past"]) for s in report["shapes"]}
    assert any(w == 1 for _, w, _ in shapes) and any(p == 0 for _, _, p in shapes) and any(b > 1 for b, _, _ in shapes)


def family_params():
    from tiny_models import FAMILIES

    return list(FAMILIES)


@pytest.mark.parametrize("family", family_params())
def test_tokenizer_file_is_the_models_own(tiny_artifact, family):
    """The artifact's tokenizer.json tokenizes like the model folder's tokenizer.json, and every id it
    can produce is inside the model's vocabulary; so its vocab_sha256 equals that of the other families,
    which all ship the same tokenizer."""
    from tokenizers import Tokenizer

    exported = tiny_artifact(family)
    text = 'Jacobi decoding: café 東京 🙂 {"key": [1, 2]}  two  spaces\n\n<|im_start|>user<|im_end|>'
    saved = Tokenizer.from_file(str(exported.artifact / "tokenizer.json"))
    source = Tokenizer.from_file(str(exported.model_dir / "tokenizer.json"))
    assert saved.encode(text).ids == source.encode(text).ids
    assert saved.get_vocab(with_added_tokens=True) == source.get_vocab(with_added_tokens=True)
    assert max(saved.get_vocab(with_added_tokens=True).values()) < exported.manifest.architecture.vocab_size
    assert exported.manifest.tokenizer["vocab_sha256"] == tiny_artifact("llama").manifest.tokenizer["vocab_sha256"]


@pytest.fixture(scope="module")
def other_vocab_draft(tiny_model, tiny_artifact, tmp_path_factory):
    """The tiny llama with another tokenizer (and no chat template), exported as a draft with a shorter max_context."""
    from jacobi_rt.exporter import ExportOptions, export

    root = tmp_path_factory.mktemp("other-vocab")
    folder = root / "model"
    shutil.copytree(tiny_model("llama"), folder)
    for p in [*folder.glob("tokenizer*"), *folder.glob("chat_template*")]:
        p.unlink()
    other_tokenizer().save_pretrained(folder)
    return export(str(folder), root / "artifact", ExportOptions(role="draft", max_context=100)), root / "artifact"


def test_vocab_sha256_differs_for_another_vocabulary(other_vocab_draft, tiny_artifact):
    manifest, _ = other_vocab_draft
    assert manifest.tokenizer["vocab_sha256"] != tiny_artifact("llama").manifest.tokenizer["vocab_sha256"]


def test_role_and_max_context_recorded(other_vocab_draft):
    manifest, folder = other_vocab_draft
    raw = json.loads((folder / "jacobi.json").read_text())
    assert raw["role"] == "draft" and raw["max_context"] == 100
    assert raw["architecture"]["max_positions"] == 256  # the model's own limit is still recorded
    assert raw["tokenizer"]["chat_template"] is None and not (folder / "chat_template.jinja").exists()
