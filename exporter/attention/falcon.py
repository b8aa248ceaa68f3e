"""Falcon's attention routed through transformers' attention interface, for the export only.

FalconAttention before transformers 5.x computes its eager attention inline instead of calling the
registered attention function (5.x calls it, and needs no routing), so neither the grouped attention
(portable graph) nor the in-place attention could replace it. During a trace its forward is swapped
for the same maths up to the rotary and the cache, then the export's attention function. The export's
check runs the original forward against the graph, so the two are compared every export. ALiBi
Falcons (falcon-rw) are refused before tracing (limits.check_config).
"""

from __future__ import annotations

import contextlib
import functools
import types


def routed_forward(
    self,
    hidden_states,
    alibi,
    attention_mask,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    attention=None,
    **kwargs,
):
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    query, key, value = self._split_heads(self.query_key_value(hidden_states))  # [B, W, heads, D] each
    batch, window = query.shape[:2]
    kv_heads = (
        self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    )  # new: keys broadcast to every head
    query = query.transpose(1, 2).reshape(batch, self.num_heads, window, self.head_dim)
    key = key.transpose(1, 2).reshape(batch, kv_heads, window, self.head_dim)
    value = value.transpose(1, 2).reshape(batch, kv_heads, window, self.head_dim)
    cos, sin = position_embeddings
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx)
    out, _ = attention(self, query, key, value, attention_mask, scaling=self.head_dim**-0.5)  # [B, W, heads, D]
    return self.dense(out.reshape(batch, window, self.num_heads * self.head_dim)), None


@contextlib.contextmanager
def falcon_attention_routed(model, function):
    """Route every FalconAttention of `model` through the attention `function`; restore on exit."""
    from transformers.models.falcon.modeling_falcon import FalconAttention

    if not hasattr(FalconAttention, "_split_heads"):  # transformers 5.x: it calls the attention interface itself
        yield model
        return
    modules = [m for m in model.modules() if isinstance(m, FalconAttention)]
    for module in modules:
        module.forward = types.MethodType(functools.partial(routed_forward, attention=function), module)
    try:
        yield model
    finally:
        for module in modules:
            del module.forward  # back to the class's forward
