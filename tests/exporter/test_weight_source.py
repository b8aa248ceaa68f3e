"""exporter/weights/weight_source.py: a model's weights read one tensor at a time equal transformers' load bit for bit.

The reference is always transformers' own `from_pretrained(..., dtype=torch.float32)` of the same
files; the model handed to `open_source` is a skeleton with its parameters on the meta device.
"""

from __future__ import annotations

import gc
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import save_tiny_model, tiny_config

from jacobi_rt.exporter.sources import resolve
from jacobi_rt.exporter.weights.weight_source import GgufSource, SafetensorsSource, open_source
from jacobi_rt.runtime.errors import ModelSourceError

FAMILIES = ["llama", "llama-mha-tied", "qwen2", "gpt2", "phi3", "gemma2"]


def skeleton(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so -0.0 != 0.0 and NaNs compare)."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float16: torch.int16}[t.dtype])


def assert_reads_equal(source, reference: dict[str, torch.Tensor], model, dtype=torch.float32) -> None:
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert sorted(source.keys()) == sorted(names)
    for key in names:
        got = source.read(key, dtype)
        assert got.dtype == dtype and tuple(got.shape) == source.shape(key) == tuple(reference[key].shape), key
        assert torch.equal(bits(got), bits(reference[key].to(dtype))), f"{key} differs from transformers' load"


@pytest.mark.parametrize("family", FAMILIES)
def test_folder_reads_equal_from_pretrained(family, tiny_model, hf_model):
    folder = tiny_model(family)
    model = skeleton(tiny_config(family))
    with open_source(resolve(str(folder)), model) as source:
        assert isinstance(source, SafetensorsSource)
        assert_reads_equal(source, hf_model(folder).state_dict(), model)


@pytest.fixture(scope="module")
def bf16_shards(tmp_path_factory) -> Path:
    """The tiny Llama saved in bfloat16 as several shards with an index."""
    from transformers import AutoModelForCausalLM

    folder = save_tiny_model(tiny_config("llama"), tmp_path_factory.mktemp("fp32") / "llama")
    out = tmp_path_factory.mktemp("bf16") / "llama"
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(out, max_shard_size="40KB")
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 2 and (out / "model.safetensors.index.json").is_file()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bf16_shards_stream_as_loaded(bf16_shards, dtype):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(bf16_shards, dtype=torch.float32).state_dict()
    model = skeleton(tiny_config("llama"))
    with open_source(resolve(str(bf16_shards)), model) as source:
        assert_reads_equal(source, reference, model, dtype)


def test_shards_without_index(bf16_shards, tmp_path, hf_model):
    folder = copy_folder(bf16_shards, tmp_path / "no-index")
    (folder / "model.safetensors.index.json").unlink()
    model = skeleton(tiny_config("llama"))
    with open_source(resolve(str(folder)), model) as source:
        assert_reads_equal(source, hf_model(bf16_shards).state_dict(), model)


def test_checkpoint_without_base_prefix(tiny_model, tmp_path, hf_model):
    """An old gpt2 checkpoint names `h.0.attn...` without `transformer.`: renamed as transformers does."""
    from safetensors.torch import load_file, save_file

    folder = copy_folder(tiny_model("gpt2"), tmp_path / "gpt2-old")
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k.removeprefix("transformer."): v for k, v in weights.items()}, folder / "model.safetensors", {"format": "pt"}
    )
    model = skeleton(tiny_config("gpt2"))
    with open_source(resolve(str(folder)), model) as source:
        assert_reads_equal(source, hf_model(tiny_model("gpt2")).state_dict(), model)


# --- errors: raised by open_source, naming the tensor --------------------------------------------


def copy_folder(src: Path, dst: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dst))


def rewrite(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", {"format": "pt"})


KEY = "model.layers.1.self_attn.k_proj.weight"


@pytest.mark.parametrize(
    "case, change, words",
    [
        ("missing", lambda w: w.pop(KEY), "not in the weight files"),
        ("shape", lambda w: w.__setitem__(KEY, w[KEY][:-1].clone()), "has shape [31, 64]"),
        ("int8", lambda w: w.__setitem__(KEY, w[KEY].to(torch.int8)), "is I8"),
        ("float8", lambda w: w.__setitem__(KEY, w[KEY].to(torch.float8_e4m3fn)), "is F8_E4M3"),
    ],
)
def test_bad_tensor_is_refused_before_reading(case, change, words, tiny_model, tmp_path):
    folder = copy_folder(tiny_model("llama"), tmp_path / case)
    rewrite(folder, change)
    with pytest.raises(ModelSourceError, match=KEY) as info:
        open_source(resolve(str(folder)), skeleton(tiny_config("llama")))
    assert words in str(info.value)


def test_truncated_shard(bf16_shards, tmp_path):
    folder = copy_folder(bf16_shards, tmp_path / "cut")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    shard = folder / index[KEY]
    shard.write_bytes(shard.read_bytes()[:-100])
    cut = sorted(k for k, f in index.items() if f == index[KEY])
    with pytest.raises(ModelSourceError, match="truncated") as info:
        open_source(resolve(str(folder)), skeleton(tiny_config("llama")))
    assert any(k in str(info.value) for k in cut) and shard.name in str(info.value)


def test_bin_only_folder_says_how_to_convert(tiny_model, tmp_path):
    from safetensors.torch import load_file

    folder = copy_folder(tiny_model("llama"), tmp_path / "bin")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelSourceError, match="needs safetensors") as info:
        open_source(resolve(str(folder)), skeleton(tiny_config("llama")))
    assert "save_pretrained" in str(info.value)


def test_converted_key_is_refused(tmp_path):
    """Mixtral's checkpoint keeps one tensor per expert, which transformers fuses on load (a conversion,
    not a rename): streaming refuses it, naming the fused parameter."""
    from transformers import MixtralConfig

    config = MixtralConfig(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=2,
    )
    folder = save_tiny_model(config, tmp_path / "mixtral")
    with pytest.raises(
        ModelSourceError, match=r"model\.layers\.0\.mlp\.experts\.\S+ through one of transformers' weight conversions"
    ):
        SafetensorsSource(folder, skeleton(config))


# --- GGUF ----------------------------------------------------------------------------------------

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None,
    reason="GGUF sources need the `gguf` package: pip install 'jacobi-rt[export]'",
)


def gguf_reference(path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    return reference, skeleton(AutoConfig.from_pretrained(path.parent, gguf_file=path.name))


def assert_blocks_give_reads(source: GgufSource) -> None:
    """blocks(): the file's own data, de-quantized by gguf and put in the stated row order, is read()."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    for key in source.keys():
        b = source.blocks(key)
        values = dequantize(b.raw, GGMLQuantizationType[b.kind]).reshape(b.shape)[b.rows]
        values = values.T if b.transposed else values
        assert np.array_equal(
            np.ascontiguousarray(values).view(np.uint32), source.read(key, torch.float32).numpy().view(np.uint32)
        ), key


@needs_gguf
@pytest.mark.parametrize("qtype, tied", [("Q4_1", False), ("Q8_0", True), ("Q4_K", False)])
def test_tiny_gguf_reads_equal_transformers(qtype, tied, tmp_path):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", qtype, tied=tied, wide=qtype.endswith("_K"))
    reference, model = gguf_reference(path)
    with open_source(resolve(str(path)), model) as source:
        assert isinstance(source, GgufSource)
        assert_reads_equal(source, reference, model)
        assert_blocks_give_reads(source)
        q = source.blocks("model.layers.0.self_attn.q_proj.weight")
        assert q.kind == qtype and not np.array_equal(q.rows, np.arange(len(q.rows)))  # Llama's q rows are reordered
        assert np.array_equal(source.blocks("model.layers.0.self_attn.v_proj.weight").rows, np.arange(len(q.rows) // 2))
        assert source.config()["num_key_value_heads"] == 2


def write_gpt2_gguf(path: Path, hf_folder: Path) -> Path:
    """The tiny gpt2 as llama.cpp writes it: Conv1D weights transposed to [out, in], matrices Q8_0, tied head."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize
    from safetensors.torch import load_file

    hf = {k.removeprefix("transformer."): v.numpy() for k, v in load_file(hf_folder / "model.safetensors").items()}
    config = tiny_config("gpt2")
    writer = GGUFWriter(str(path), "gpt2")
    writer.add_context_length(1024)  # transformers' gpt2 GGUF config keeps n_positions at its default 1024
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])  # the vocabulary size transformers reads
    wpe = np.zeros((1024, config.n_embd), np.float32)
    wpe[: hf["wpe.weight"].shape[0]] = hf["wpe.weight"]
    tensors = {
        "token_embd.weight": hf["wte.weight"],
        "position_embd.weight": wpe,
        "output_norm.weight": hf["ln_f.weight"],
        "output_norm.bias": hf["ln_f.bias"],
    }
    parts = {
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }
    for i in range(config.n_layer):
        for hf_part, part in parts.items():
            for leaf in ("weight", "bias"):
                value = hf[f"h.{i}.{hf_part}.{leaf}"]
                tensors[f"blk.{i}.{part}.{leaf}"] = value.T.copy() if value.ndim == 2 else value
    for name, value in tensors.items():
        if value.ndim == 2 and name != "position_embd.weight":
            writer.add_tensor(name, quantize(value, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs_gguf
def test_gpt2_gguf_transposed_weights(tiny_model, tmp_path):
    path = write_gpt2_gguf(tmp_path / "gpt2-Q8_0.gguf", tiny_model("gpt2"))
    reference, model = gguf_reference(path)
    with open_source(resolve(str(path)), model) as source:
        assert_reads_equal(source, reference, model)
        assert_blocks_give_reads(source)
        assert source.blocks("transformer.h.0.attn.c_attn.weight").transposed
        assert not source.blocks("transformer.wte.weight").transposed


@needs_gguf
def test_gguf_integer_tensor_is_refused(tmp_path):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "int.gguf", "Q8_0", overrides={"blk.1.attn_v.weight": "I8"})
    from transformers import AutoConfig

    model = skeleton(AutoConfig.from_pretrained(path.parent, gguf_file=path.name))
    with pytest.raises(ModelSourceError, match=r"blk\.1\.attn_v\.weight is I8"):
        open_source(resolve(str(path)), model)


@needs_gguf
def test_gguf_missing_tensor(tmp_path):
    """A model with a layer more than the file: its tensors are missing."""
    from tiny_gguf import write_tiny_gguf
    from transformers import AutoConfig

    path = write_tiny_gguf(tmp_path / "tiny.gguf", "Q8_0")
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    config.num_hidden_layers += 1
    with pytest.raises(ModelSourceError, match=r"model\.layers\.2\.\S+ is not in the weight files"):
        open_source(resolve(str(path)), skeleton(config))


@needs_gguf
@pytest.mark.slow
def test_smollm2_gguf_reads_equal_transformers():
    try:
        source_ref = resolve("smollm2-135m")
    except ModelSourceError as exc:
        pytest.skip(f"the built-in SmolLM2 GGUF is not installed: {exc}")
    reference, model = gguf_reference(source_ref.folder / source_ref.gguf_file)
    with open_source(source_ref, model) as source:
        assert_reads_equal(source, reference, model)
        del reference
        assert_blocks_give_reads(source)
        assert {source.blocks(k).kind for k in source.keys()} == {"Q4_1", "Q8_0", "F32"}


# --- memory --------------------------------------------------------------------------------------


def test_reading_every_tensor_keeps_memory_flat(tmp_path):
    """~100 MB of fp32 weights read twice over, one tensor at a time: the process grows by the tensor
    held plus what the allocator keeps for reuse, never by what was read. glibc serves blocks under its
    32 MiB mmap threshold from the heap and keeps up to twice that block free (its trim threshold),
    hence the 16 MiB slack here; larger tensors (a 7B model's) are mapped and unmapped each time."""
    import psutil
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    )
    folder = save_tiny_model(config, tmp_path / "mid")
    gc.collect()
    process = psutil.Process()
    with open_source(resolve(str(folder)), skeleton(config)) as source:
        largest = max(int(np.prod(source.shape(k))) * 4 for k in source.keys())
        total = sum(int(np.prod(source.shape(k))) * 4 for k in source.keys())
        source.read(source.keys()[0], torch.float32)  # first-call allocations are not what is measured
        gc.collect()
        before, peak = process.memory_info().rss, 0
        for key in source.keys() * 2:
            tensor = source.read(key, torch.float32)
            peak = max(peak, process.memory_info().rss)
            del tensor
    growth = peak - before
    print(
        f"read {total / 2**20:.0f} MB twice in {len(source.keys())} tensors: RSS grew {growth / 2**20:.1f} MB, "
        f"largest tensor {largest / 2**20:.0f} MB"
    )
    assert total > 10 * largest and growth < 2 * largest + 16 * 2**20
