"""A tiny random Llama written as a GGUF file with the `gguf` package, its linear weights quantized.

The layout is llama.cpp's (`token_embd`, `blk.N.attn_q`, ...; q/k rows permuted the way its
converter does, which transformers' loader undoes), with the tiny byte-level BPE tokenizer of
tiny_models.py. Needs numpy and gguf (and tokenizers for the vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny_models import CHAT_TEMPLATE, VOCAB, tiny_tokenizer

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
WIDE_HIDDEN, WIDE_FFN = 256, 512  # K-quants pack 256 values a block: every K must be a multiple of 256
RAW_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL")  # written as random blocks (k_quant_blocks)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotary halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama_tensors(
    seed: int = 0, tied: bool = False, hidden: int = HIDDEN, ffn: int = FFN
) -> dict[str, np.ndarray]:
    """name -> float32 array in GGUF orientation ([N, K] for linear weights)."""
    rng = np.random.default_rng(seed)
    scale = 4.0 / np.sqrt(hidden)  # large enough that greedy output varies (as tiny_models does)
    head_dim = hidden // HEADS

    def linear(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k)) * scale).astype(np.float32)

    tensors = {"token_embd.weight": linear(VOCAB, hidden), "output_norm.weight": np.ones(hidden, np.float32)}
    if not tied:
        tensors["output.weight"] = linear(VOCAB, hidden)
    for i in range(LAYERS):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
            b + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
            b + "attn_q.weight": _permute(linear(HEADS * head_dim, hidden), HEADS),
            b + "attn_k.weight": _permute(linear(KV_HEADS * head_dim, hidden), KV_HEADS),
            b + "attn_v.weight": linear(KV_HEADS * head_dim, hidden),
            b + "attn_output.weight": linear(hidden, HEADS * head_dim),
            b + "ffn_gate.weight": linear(ffn, hidden),
            b + "ffn_up.weight": linear(ffn, hidden),
            b + "ffn_down.weight": linear(hidden, ffn),
        }
    return tensors


def write_tiny_gguf(
    path: Path,
    qtype: str,
    tied: bool = False,
    overrides: dict[str, str] | None = None,
    seed: int = 0,
    wide: bool = False,
) -> Path:
    """Write the tiny Llama to PATH with every 2-D weight in `qtype` (overrides: tensor -> another type).
    wide: hidden 256 and FFN 512, which K-quants need; their blocks are random (`k_quant_blocks`)."""
    import gguf
    from gguf.quants import quantize

    hidden, ffn = (WIDE_HIDDEN, WIDE_FFN) if wide else (HIDDEN, FFN)
    rng = np.random.default_rng(seed + 1)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(hidden // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    _add_tokenizer(writer)
    for name, array in tiny_llama_tensors(seed, tied, hidden, ffn).items():
        kind = (overrides or {}).get(name, qtype) if array.ndim == 2 else "F32"
        ggml = gguf.GGMLQuantizationType[kind]
        if kind in RAW_TYPES:
            data = k_quant_blocks(kind, *array.shape, rng)
        elif kind == "I8":  # an integer tensor: a type no loader de-quantizes (the streaming error tests)
            data = np.clip(np.rint(array * 32), -127, 127).astype(np.int8)
        else:
            data = array if kind == "F32" else quantize(array, ggml)
        writer.add_tensor(name, data, raw_dtype=None if kind in ("F32", "I8") else ggml)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def k_quant_blocks(kind: str, n: int, k: int, rng) -> np.ndarray:
    """Random but well-formed blocks for an [n, k] weight in a type the gguf package cannot quantize to
    (K-quants; IQ4_NL, a type --weights gguf has no exact form for), centred near zero with a spread
    like tiny_llama_tensors': uint8 [n, k / values-per-block * bytes]. Where a type has mins
    (w = d*sc*q - dmin*mn), mn = sc and dmin is half the levels times d, so each sub-block is symmetric."""
    if kind == "IQ4_NL":  # blocks of 32: d | 16 bytes of indices into a fixed table
        d = rng.uniform(2e-3, 4e-3, n * k // 32) * 1.0
        return np.concatenate([_fp16(d), rng.integers(0, 256, (n * k // 32, 16), dtype=np.uint8)], axis=1).reshape(
            n, -1
        )
    supers = n * k // 256
    d = (
        rng.uniform(2e-3, 4e-3, supers) * {"Q2_K": 6.0, "Q3_K": 1.3, "Q4_K": 0.375, "Q5_K": 0.19, "Q6_K": 0.047}[kind]
    )  # std ~0.2
    if kind == "Q2_K":  # scales 16 (sc low nibble, mn high) | qs 64 | d | dmin
        sc = rng.integers(1, 16, (supers, 16)).astype(np.uint8)
        blocks = np.concatenate(
            [sc | (sc << 4), rng.integers(0, 256, (supers, 64), dtype=np.uint8), _fp16(d), _fp16(1.5 * d)], axis=1
        )
    elif kind == "Q3_K":  # hmask 32 | qs 64 | scales 12 | d
        blocks = np.concatenate([rng.integers(0, 256, (supers, 108), dtype=np.uint8), _fp16(d)], axis=1)
    elif kind == "Q6_K":  # ql 128 | qh 64 | int8 scales 16 | d
        scales = rng.integers(-127, 128, (supers, 16)).astype(np.int8).view(np.uint8)
        blocks = np.concatenate([rng.integers(0, 256, (supers, 192), dtype=np.uint8), scales, _fp16(d)], axis=1)
    else:  # d | dmin | 12 bytes of 6-bit scales and mins | (Q5_K: qh 32) | qs 128
        levels = 16 if kind == "Q4_K" else 32
        sc = rng.integers(1, 64, (supers, 8)).astype(np.uint8)
        first = (sc[:, :4] & 0x3F) | (
            (sc[:, 4:] >> 4) << 6
        )  # scales 0-3 and the top bits of 4-7; the mins, equal, alike
        packed = np.concatenate([first, first, (sc[:, 4:] & 0x0F) | ((sc[:, 4:] & 0x0F) << 4)], axis=1)
        quants = rng.integers(0, 256, (supers, 128 if kind == "Q4_K" else 160), dtype=np.uint8)
        blocks = np.concatenate([_fp16(d), _fp16(d * (levels - 1) / 2), packed, quants], axis=1)
    return blocks.reshape(n, -1)


def _fp16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _add_tokenizer(writer) -> None:
    spec = json.loads(tiny_tokenizer().backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["content"] for t in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in specials else 1 for t, _ in vocab])  # 3 = control
    writer.add_token_merges(merges)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
