"""Grouped-query attention without repeat_kv, registered with transformers for export.

Eager attention repeats every KV head for each query head of its group (`repeat_kv`): a copy
of the whole cache per layer and pass, which grows with the past. Here the query heads of a
group are folded into the query length instead ([B, kv_heads, group * window, D]), so the
cache is read in place. Same maths, same ONNX ops (MatMul, Softmax), portable to TensorRT.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "jacobi_grouped"


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    # query: [B, H, W, D]; key, value: [B, Hkv, T, D] (cache included); attention_mask: [B, 1, W, T] additive
    batch, heads, window, dim = query.shape
    kv_heads, total = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query head h reads kv head h // group, as repeat_kv orders them
    if scaling is None:
        scaling = dim**-0.5
    q = query.reshape(batch, kv_heads, group * window, dim)
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling  # [B, Hkv, G*W, T]
    scores = scores.view(batch, kv_heads, group, window, total)
    if softcap is not None:  # Gemma 2's attention logit soft-capping, before the mask as in its eager attention
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None]  # [B, 1, 1, W, T]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs.view(batch, kv_heads, group * window, total), value)  # [B, Hkv, G*W, D]
    out = out.view(batch, heads, window, dim).transpose(1, 2).contiguous()  # [B, W, H, D]
    return out, None


@contextlib.contextmanager
def attention_swapped(model, name: str, function):
    """Switch `model` to the attention `function` (registered as `name`) for the duration of a trace or
    check; restore eager on exit."""
    from transformers import AttentionInterface

    from .falcon import falcon_attention_routed

    AttentionInterface.register(name, function)
    model.set_attn_implementation(name)
    try:
        with falcon_attention_routed(
            model, function
        ):  # the one supported family whose attention bypasses the interface
            yield model
    finally:
        model.set_attn_implementation("eager")


def grouped_attention_for(model):
    """Switch `model` to grouped attention for the duration of a trace; restore eager on exit."""
    return attention_swapped(model, NAME, grouped_attention)
