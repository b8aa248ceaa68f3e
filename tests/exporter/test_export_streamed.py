"""The streamed export (a skeleton traced, each weight read from the source as it is written) against
the export of the same model loaded whole: the same files, byte for byte, and one copy of the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny_model, tiny_config

GRAPHS = ("model.onnx", "model-inplace.onnx")


def _export(model_dir: Path, out: Path, **options):
    from jacobi_rt.exporter import ExportOptions, export

    return export(str(model_dir), out, ExportOptions(**options), overwrite=True)


def _stitched(family: str, folder: Path, dtype=None, shard: str | None = None) -> Path:
    """A tiny `family` model with enough layers that the export writes some as copies (stitch.py)."""
    return save_tiny_model(tiny_config(f"{family}-5layers"), folder, dtype=dtype, max_shard_size=shard)


def _graph_locations(folder: Path) -> set[str]:
    import onnx

    places = set()
    for name in GRAPHS:
        model = onnx.load(str(folder / name), load_external_data=False)
        places |= {e.value for i in model.graph.initializer for e in i.external_data if e.key == "location"}
    return places


@pytest.fixture(scope="module")
def streamed_llama(tiny_artifact):
    """(source, its streamed artifact, the manifest): a 5-layer Llama exported with the default options
    (tiny_models.STITCHED: CI's prebuilt one), shared by the tests that read it."""
    exported = tiny_artifact("llama-5layers")
    return exported.model_dir, exported.artifact, exported.manifest


# Qwen2 and the other families' reads are compared with transformers' load in test_weight_source.py;
# these cover an untied and a tied Llama and GPT-2's Conv1D weights end to end. The streamed export is the
# session's (the default options stream) where there is one of that model.
@pytest.mark.parametrize("family", ["llama", "llama-mha-tied", "gpt2"])
def test_streamed_equals_loaded_whole(family, tmp_path, tiny_artifact):
    if family in ("llama", "gpt2"):
        exported = tiny_artifact(f"{family}-5layers")
        source, folder, streamed = exported.model_dir, exported.artifact, exported.manifest
    else:
        source, folder = _stitched(family, tmp_path / "model"), tmp_path / "streamed"
        streamed = _export(source, folder)
    whole = _export(source, tmp_path / "whole", stream=False)
    for name in (*GRAPHS, "weights.data"):
        assert (folder / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert streamed.files == whole.files
    for graph in streamed.check:  # PyTorch's side of the check ran on other memory: the last bits may differ
        mine, theirs = streamed.check[graph], whole.check[graph]
        assert {k: v for k, v in mine.items() if "diff" not in k and k != "shapes"} == {
            k: v for k, v in theirs.items() if "diff" not in k and k != "shapes"
        }
        assert mine["max_logit_diff"] == pytest.approx(theirs["max_logit_diff"], abs=1e-5)


def test_one_copy_of_the_weights(streamed_llama):
    """Both graphs read the one weights file, which holds each parameter once."""
    import onnx
    import torch
    from transformers import AutoModelForCausalLM

    source, folder, manifest = streamed_llama
    assert set(manifest.graphs.values()) == set(GRAPHS)
    assert _graph_locations(folder) == {"weights.data"}
    assert not list(folder.glob("*.onnx.data"))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    params = sum(p.numel() * 4 for p in model.parameters())
    size = (folder / "weights.data").stat().st_size
    assert size <= 1.05 * params, (size, params)
    inline = sum(
        len(i.raw_data)
        for name in GRAPHS
        for i in onnx.load(str(folder / name), load_external_data=False).graph.initializer
        if not i.external_data
    )
    assert inline <= 0.05 * params, (inline, params)  # only small tensors (norms, biases) stay in the graphs


def test_sharded_bfloat16_source(tmp_path):
    """A bf16 model in shards with model.safetensors.index.json streams to what the whole-model load gives."""
    import torch

    source = _stitched("llama", tmp_path / "model", dtype=torch.bfloat16, shard="100KB")
    assert (source / "model.safetensors.index.json").is_file()
    assert len(list(source.glob("*.safetensors"))) > 2
    streamed = _export(source, tmp_path / "streamed")
    _export(source, tmp_path / "whole", stream=False)
    assert (tmp_path / "streamed" / "weights.data").read_bytes() == (tmp_path / "whole" / "weights.data").read_bytes()
    assert streamed.check["vs_pytorch"]["greedy_agree"] == streamed.check["vs_pytorch"]["positions"]


def test_streamed_artifact_generates_as_loaded(streamed_llama):
    """The runtime reads the shared weights file: the same tokens from either graph."""
    from jacobi_rt.runtime import Generator

    outputs = {}
    for graph in ("portable", "inplace"):
        generator = Generator.load(streamed_llama[1], graph=graph)
        outputs[graph] = generator.generate([1, 2, 3, 4], max_new_tokens=12, strategy="greedy").ids
    assert outputs["portable"] == outputs["inplace"]


def test_disk_too_small_is_refused_before_any_work(tmp_path):
    import shutil

    from jacobi_rt.exporter.budget import check_disk
    from jacobi_rt.runtime.errors import OptionError

    free = shutil.disk_usage(tmp_path).free
    check_disk(tmp_path, free // 2)
    with pytest.raises(OptionError, match=r"needs about .* GB .* GB are free"):
        check_disk(tmp_path, free + 10**9)


def test_gguf_streams_to_what_the_whole_load_gives(tmp_path):
    """A GGUF's tensors are read and de-quantized one at a time (weight_source.GgufSource), never the whole
    file to float32 first: the same artifact, byte for byte, as transformers' whole-model load (tied, as
    SmolLM2's; the untied reads are compared with transformers' in test_weight_source.py)."""
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", "Q8_0", tied=True)
    streamed = _export(path, tmp_path / "streamed")
    whole = _export(path, tmp_path / "whole", stream=False)
    for name in (*GRAPHS, "weights.data"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert streamed.files == whole.files and streamed.tokens == whole.tokens
    assert streamed.check["vs_pytorch"]["greedy_agree"] == streamed.check["vs_pytorch"]["positions"]
