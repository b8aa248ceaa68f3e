"""`jacobi-rt random-model`: real checkpoints' shapes, shards that transformers loads, GGUFs that gguf and
transformers read, and memory that stays at a chunk (or one tensor) whatever the model's size."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from jacobi_rt.tools.cli.main import cli
from jacobi_rt.tools.random_gguf import tensor_type
from jacobi_rt.tools.random_model import make_random_model
from jacobi_rt.tools.random_shapes import CONFIGS, config_for, parameter_count, tensor_shapes
from jacobi_rt.tools.random_values import encode, tensor_values, value_chunks

gguf = pytest.importorskip("gguf", reason="GGUF output needs the gguf package: pip install gguf")


def _torch():
    pytest.importorskip("torch", reason="loading the written model needs torch and transformers (the export extra)")
    return pytest.importorskip("transformers", reason="loading the written model needs transformers (the export extra)")


def test_parameter_counts_are_the_checkpoints_with_smollm2s_vocabulary():
    # Llama-3-8B has 8.03B with its 128,256-token vocabulary; with 49,152 tokens the two vocab matrices shrink
    # by 2 * 79,104 * 4096 = 648M parameters: 7.38B (the "7.4B, 14.8 GB in bf16").
    assert parameter_count(config_for("llama-3-8b")) == 8_030_261_248 - 2 * (128256 - 49152) * 4096
    assert round(parameter_count(config_for("tinyllama-1.1b")) / 1e9, 2) == 1.17
    assert parameter_count(config_for("smollm2-135m")) == 134_515_008  # SmolLM2-135M itself (tied)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_shape_is_what_transformers_builds_from_its_config(name):
    transformers = _torch()
    import torch

    config = transformers.AutoConfig.for_model(**config_for(name, layers=2))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    built = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert built == {s.name: s.shape for s in tensor_shapes(config_for(name, layers=2))}
    if name == "qwen2.5-7b":
        assert "model.layers.0.self_attn.q_proj.bias" in built  # Qwen2's qkv biases


def test_chunks_are_the_same_values_whatever_their_size():
    spec = tensor_shapes(config_for("smollm2-135m", layers=1))[2]  # q_proj
    small = np.concatenate(list(value_chunks(spec, 2, seed=7, std=0.02, chunk=1000)))
    assert np.array_equal(small, tensor_values(spec, 2, seed=7, std=0.02).ravel())
    assert not np.array_equal(small, tensor_values(spec, 2, seed=8, std=0.02).ravel())  # the seed matters
    assert abs(small.std() - 0.02) < 1e-3


def test_bf16_shards_load_in_transformers_with_their_config(tmp_path):
    transformers = _torch()
    import torch

    out = tmp_path / "smollm2"
    report = make_random_model("smollm2-135m", out, "bf16", layers=3, shard_bytes=20_000_000, quiet=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_key_value_heads) == (3, 576, 3)
    assert (
        model.config.vocab_size == 49152
        and model.config.tie_word_embeddings
        and model.config.rope_parameters["rope_theta"] == 100000.0
    )
    specs = tensor_shapes(config_for("smollm2-135m", layers=3))
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {s.name: s.shape for s in specs}
    q = model.model.layers[1].self_attn.q_proj.weight.detach().view(torch.int16).numpy().view(np.uint16)
    index_q = next(i for i, s in enumerate(specs) if s.name == "model.layers.1.self_attn.q_proj.weight")
    assert np.array_equal(
        q, encode(tensor_values(specs[index_q], index_q, 0, config_for("smollm2-135m")["initializer_range"]), "bf16")
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert (
        len(tokenizer) == 49152
        and tokenizer.eos_token == "<|im_end|>"
        and tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    )
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert report.parameters == sum(p.numel() for p in model.parameters())


def test_q4_0_gguf_is_the_same_model_quantized_in_llamacpp_layout(tmp_path):
    transformers = _torch()
    import torch

    out = tmp_path / "smollm2"
    make_random_model("smollm2-135m", out, "fp32", gguf="Q4_0", layers=2, quiet=True)
    reader = gguf.GGUFReader(out / "model-Q4_0.gguf")
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert (
        types["token_embd.weight"] == "Q4_0"
        and types["blk.1.attn_norm.weight"] == "F32"
        and "output.weight" not in types
    )
    assert str(bytes(reader.fields["tokenizer.ggml.model"].parts[-1]), "utf-8") == "gpt2"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152
    float_model = transformers.AutoModelForCausalLM.from_pretrained(out)
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(out, gguf_file="model-Q4_0.gguf")
    assert gguf_model.config.num_hidden_layers == 2 and gguf_model.config.vocab_size == 49152
    for name in ("q_proj", "k_proj", "v_proj"):  # the loader undoes the q/k permutation: only Q4_0's rounding is left
        ours = getattr(gguf_model.model.layers[0].self_attn, name).weight
        theirs = getattr(float_model.model.layers[0].self_attn, name).weight
        assert torch.allclose(ours, theirs, atol=0.02), name
        assert not torch.allclose(ours, torch.roll(theirs, 1, 0), atol=0.05)  # rows in the wrong order would not pass


def test_q4_k_m_gguf_has_llamacpps_mix_and_loads(tmp_path):
    transformers = _torch()

    path = tmp_path / "tiny.gguf"
    make_random_model("tinyllama-1.1b", path, gguf="Q4_K_M", layers=8, quiet=True)
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert (
        types["output.weight"] == "Q6_K"
        and types["token_embd.weight"] == "Q4_K"
        and types["blk.3.attn_q.weight"] == "Q4_K"
    )
    # use_more_bits over 8 layers: layers 0 and 7, and (i - 1) % 3 == 2 -> 3 and 6
    assert [i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert Counter(types.values()) == {"Q4_K": 8 * 7 - 8 + 1, "Q6_K": 8 + 1, "F32": 8 * 2 + 1}
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name)
    weight = model.model.layers[2].mlp.up_proj.weight
    assert tuple(weight.shape) == (5632, 2048) and 0.015 < float(weight.detach().std()) < 0.025


def test_rows_that_are_not_whole_k_blocks_fall_back_like_llamacpp():
    specs = {s.name: s for s in tensor_shapes(config_for("smollm2-135m", layers=1))}  # hidden 576 = 2.25 blocks of 256
    types = {name: tensor_type(s, "Q4_K_M", 1) for name, s in specs.items() if len(s.shape) == 2}
    assert types["model.layers.0.self_attn.q_proj.weight"] == "Q5_0"  # Q4_K's fallback
    assert types["model.layers.0.self_attn.v_proj.weight"] == "Q8_0"  # Q6_K's (attn_v gets more bits in layer 0)
    assert types["model.layers.0.mlp.down_proj.weight"] == "Q6_K"  # rows of 1536 values: whole K blocks


_MEASURE = textwrap.dedent(r"""
    import json, re, sys
    from pathlib import Path
    from jacobi_rt.tools.random_model import write_gguf_file
    from jacobi_rt.tools.random_shapes import config_for, tensor_shapes
    from jacobi_rt.tools.random_values import encode, value_chunks
    from jacobi_rt.tools.safetensors_shards import plan_shards, write_shards
    import gguf.quants  # imported before the baseline, as the shards' modules are
    out, kind = Path(sys.argv[1]), sys.argv[2]
    config = config_for("tinyllama-1.1b", layers=2)
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's peak (kept across execve)
    peak = lambda: int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    before = peak()
    if kind == "shards":
        specs = tensor_shapes(config)
        write_shards(out, plan_shards(specs, "fp32", 200_000_000), "fp32",
                     lambda i, s: (encode(v, "fp32") for v in value_chunks(s, i, 0, 0.02)))
    else:
        write_gguf_file("tinyllama-1.1b", out / "m.gguf", "Q4_0", layers=2, quiet=True)
    after = peak()
    print(json.dumps({"grew": after - before}))
""")


@pytest.mark.parametrize("kind", ["shards", "gguf"])
def test_writing_memory_stays_far_below_the_models_size(tmp_path, kind):
    # tinyllama's width, 2 layers: 290M parameters, 1.16 GB in fp32; its largest tensor (the 49152 x 2048
    # embedding) is 403 MB in fp32. Shards are written a 32 MB chunk at a time; a GGUF a tensor at a time.
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path), kind], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grew = json.loads(done.stdout.strip().splitlines()[-1])["grew"]
    written = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert written > 1_100_000_000 if kind == "shards" else written > 150_000_000
    largest = 49152 * 2048 * 4
    assert grew < (0.5 * largest if kind == "shards" else 1.5 * largest + 300_000_000), (grew, written)


def test_the_command_refuses_gguf_for_qwen_and_an_existing_folder(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["random-model", "qwen2.5-7b", "--gguf", "Q4_0", "--out", str(tmp_path / "q")])
    assert result.exit_code == 1 and "--gguf is for llama-family shapes" in result.output, result.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    result = runner.invoke(cli, ["random-model", "smollm2-135m", "--out", str(tmp_path / "busy")])
    assert result.exit_code == 1 and "pass --overwrite to replace it" in result.output, result.output
    assert (tmp_path / "busy" / "x").exists()
