"""`jacobi::gqa`: attention over a fixed-capacity cache written in place, and its ONNX form.

The custom op's eager body is the reference semantics. It has two ONNX translations (`translation()`):
one `com.microsoft.GroupQueryAttention` node (onnxruntime contrib op, below; the default: it reads
only each row's length, whatever the capacity), or standard ops with an in-place ScatterND
(exporter/attention/scatter_attention.py: faster per layer on this CPU, but it reads the whole capacity).
In both the past and present can be bound to the same buffer so the cache is never copied:

    cache row b (capacity C):  [ prefix: length_b entries | window: W new entries | unused ... ]
                                 ^ attended through the bias  ^ written in place  ^ never read
    seqlens_k[b] = length_b + W - 1          total_len = max_b(length_b) + W  (= T)
    bias [B, 1, W, C]: 0 attends, the dtype's minimum blocks (tree/branch masks, padding, the tail)

GroupQueryAttention also applies its own causal mask (query i of row b sees keys up to
length_b + i). A window mask of the contract is a tree mask, always a subset of lower-triangular,
so bias + causal equals the bias alone: the eager body applies both, as the kernel does.
`query_seqlens` = W for every row makes the kernel accept a batch of multi-token windows over
a past (without it, W > 1 with a past requires batch 1).
"""

from __future__ import annotations

import torch

OP = "jacobi::gqa"


@torch.library.custom_op(OP, mutates_args=())
def gqa(
    query: torch.Tensor,  # [B, W, H*D], rotary already applied by the model
    key: torch.Tensor,  # [B, W, Hkv*D], the window's new keys
    value: torch.Tensor,  # [B, W, Hkv*D]
    past_key: torch.Tensor,  # [B, Hkv, C, D], fixed capacity C
    past_value: torch.Tensor,  # [B, Hkv, C, D]
    seqlens_k: torch.Tensor,  # [B] int32: length_b + W - 1
    total_len: torch.Tensor,  # [] int32: T
    bias: torch.Tensor,  # [B, 1, W, C] additive, over the whole capacity (blocked beyond each row's window)
    num_heads: int,
    kv_heads: int,
    scale: float,
    softcap: float = 0.0,  # Gemma 2's attention logit soft-capping: tanh(scores / softcap) * softcap; 0 = none
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, window, _ = query.shape
    dim = past_key.shape[-1]
    total = bias.shape[-1]  # the capacity: columns beyond a row's window are blocked by the bias
    group = num_heads // kv_heads
    lengths = seqlens_k.long() + 1 - window  # [B]
    rows = lengths[:, None] + torch.arange(window)  # [B, W]: where the window lands in each row
    index = rows[:, None, :, None].expand(batch, kv_heads, window, dim)
    k = key.view(batch, window, kv_heads, dim).transpose(1, 2)
    v = value.view(batch, window, kv_heads, dim).transpose(1, 2)
    present_key = past_key.clone().scatter_(2, index, k)
    present_value = past_value.clone().scatter_(2, index, v)
    keys, values = present_key[:, :, :total], present_value[:, :, :total]  # [B, Hkv, T, D]
    q = query.view(batch, window, kv_heads, group, dim).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, W, D]
    scores = torch.matmul(q, keys[:, :, None].transpose(-1, -2)).float() * scale  # [B, Hkv, G, W, T]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    causal = torch.arange(total)[None, None, :] <= rows[:, :, None]  # [B, W, T]
    scores = scores + bias[:, :, None].float()
    scores = scores.masked_fill(~causal[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(query.dtype)
    out = torch.matmul(probs, values[:, :, None])  # [B, Hkv, G, W, D]
    out = out.permute(0, 3, 1, 2, 4).reshape(batch, window, num_heads * dim)
    return out, present_key, present_value


@gqa.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_len, bias, num_heads, kv_heads, scale, softcap=0.0):
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


# GroupQueryAttention's inputs in onnxruntime's order (contrib_ops: GroupQueryAttention, 1.32), up to the last we use.
GQA_INPUTS = [
    ("query", "T"),
    ("key", "T"),
    ("value", "T"),
    ("past_key", "T"),
    ("past_value", "T"),
    ("seqlens_k", "M"),
    ("total_sequence_length", "M"),
    ("cos_cache", "T"),
    ("sin_cache", "T"),
    ("position_ids", "P"),
    ("attention_bias", "T"),
    ("head_sink", "T"),
    ("k_scale", "F"),
    ("v_scale", "F"),
    ("q_norm_weight", "T"),
    ("k_norm_weight", "T"),
    ("query_seqlens", "M"),
]
REQUIRED = {"query", "seqlens_k", "total_sequence_length"}


def _register_schema() -> None:
    """onnxscript builds nodes from an ONNX schema; onnx itself does not know com.microsoft's, so
    describe the part we use (onnxruntime checks the node against its own schema when it loads)."""
    import onnx.defs as defs

    if defs.has("GroupQueryAttention", "com.microsoft"):
        return
    schema = defs.OpSchema
    optional, single = schema.FormalParameterOption.Optional, schema.FormalParameterOption.Single
    defs.register_schema(
        schema(
            "GroupQueryAttention",
            "com.microsoft",
            1,
            inputs=[
                schema.FormalParameter(n, t, param_option=single if n in REQUIRED else optional) for n, t in GQA_INPUTS
            ],
            outputs=[schema.FormalParameter(n, "T") for n in ("output", "present_key", "present_value")],
            type_constraints=[
                ("T", ["tensor(float)", "tensor(float16)"], ""),
                ("M", ["tensor(int32)"], ""),
                ("P", ["tensor(int64)"], ""),
                ("F", ["tensor(float)"], ""),
            ],
            attributes=[
                schema.Attribute("num_heads", schema.AttrType.INT, required=True),
                schema.Attribute("kv_num_heads", schema.AttrType.INT, required=True),
                schema.Attribute("scale", schema.AttrType.FLOAT, required=False),
                schema.Attribute("softcap", schema.AttrType.FLOAT, required=False),
                schema.Attribute("do_rotary", schema.AttrType.INT, required=False),
            ],
        )
    )


def gqa_onnx(
    query,
    key,
    value,
    past_key,
    past_value,
    seqlens_k,
    total_len,
    bias,
    num_heads: int,
    kv_heads: int,
    scale: float,
    softcap: float = 0.0,
):
    """The ONNX translation (for torch.onnx.export's custom_translation_table): one contrib node."""
    from onnxscript import opset18 as op
    from onnxscript.values import Opset

    _register_schema()
    msft = Opset("com.microsoft", 1)
    # W from the bias every layer shares (not from this layer's query): one copy per pass after onnxruntime's CSE
    window = op.Cast(op.Shape(bias, start=2, end=3), to=6)  # [1] int32
    query_seqlens = op.Expand(window, op.Shape(seqlens_k))  # [B] = W: every row's window is whole
    bias = op.Slice(
        bias,
        op.Constant(value_ints=[0]),
        op.Reshape(op.Cast(total_len, to=7), op.Constant(value_ints=[1])),
        op.Constant(value_ints=[3]),
    )  # [B, 1, W, T]: the kernel indexes the bias by total_sequence_length
    return msft.GroupQueryAttention(
        query,
        key,
        value,
        past_key,
        past_value,
        seqlens_k,
        total_len,
        None,
        None,
        None,
        bias,
        None,
        None,
        None,
        None,
        None,
        query_seqlens,  # cos, sin, position_ids, bias, sink, scales, norms
        num_heads=num_heads,
        kv_num_heads=kv_heads,
        scale=scale,
        softcap=softcap,
        do_rotary=0,
    )


def translation(attention: str) -> dict:
    """The custom translation table: "gqa" (com.microsoft.GroupQueryAttention, the default) or
    "scatter" (standard ops, in-place ScatterND; exporter/attention/scatter_attention.py has the measurements)."""
    from .scatter_attention import scatter_attention_onnx

    return {torch.ops.jacobi.gqa.default: {"gqa": gqa_onnx, "scatter": scatter_attention_onnx}[attention]}
