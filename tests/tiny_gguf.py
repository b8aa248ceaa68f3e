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


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotary halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama_tensors(seed: int = 0, tied: bool = False) -> dict[str, np.ndarray]:
    """name -> float32 array in GGUF orientation ([N, K] for linear weights)."""
    rng = np.random.default_rng(seed)
    scale = 4.0 / np.sqrt(HIDDEN)  # large enough that greedy output varies (as tiny_models does)

    def linear(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k)) * scale).astype(np.float32)

    tensors = {"token_embd.weight": linear(VOCAB, HIDDEN), "output_norm.weight": np.ones(HIDDEN, np.float32)}
    if not tied:
        tensors["output.weight"] = linear(VOCAB, HIDDEN)
    for i in range(LAYERS):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
            b + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
            b + "attn_q.weight": _permute(linear(HEADS * HEAD_DIM, HIDDEN), HEADS),
            b + "attn_k.weight": _permute(linear(KV_HEADS * HEAD_DIM, HIDDEN), KV_HEADS),
            b + "attn_v.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            b + "attn_output.weight": linear(HIDDEN, HEADS * HEAD_DIM),
            b + "ffn_gate.weight": linear(FFN, HIDDEN),
            b + "ffn_up.weight": linear(FFN, HIDDEN),
            b + "ffn_down.weight": linear(HIDDEN, FFN),
        }
    return tensors


def write_tiny_gguf(path: Path, qtype: str, tied: bool = False, overrides: dict[str, str] | None = None, seed: int = 0) -> Path:
    """Write the tiny Llama to PATH with every 2-D weight in `qtype` (overrides: tensor -> another type)."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    _add_tokenizer(writer)
    for name, array in tiny_llama_tensors(seed, tied).items():
        kind = (overrides or {}).get(name, qtype) if array.ndim == 2 else "F32"
        ggml = gguf.GGMLQuantizationType[kind]
        data = array if kind == "F32" else quantize(array, ggml)
        writer.add_tensor(name, data, raw_dtype=None if kind == "F32" else ggml)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


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
