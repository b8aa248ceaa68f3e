"""The window graph as a torch module: contract inputs -> a Hugging Face causal LM -> contract outputs.

The model's own forward does the work. `window_mask` and `attention_mask` are combined into
the additive 4-D mask that transformers accepts ([batch, 1, window, past + window]; 0 attends,
the dtype's minimum blocks), the past is rebuilt as a DynamicCache, and the present is read back
from the cache's layers. Greedy ids are the argmax, in-graph.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.utils.generic import ModelOutput

# transformers 5.2x renamed `past_key_values` to `cache` (the old name still works, with a warning)
CACHE_ARG = "cache" if hasattr(ModelOutput, "_replace_old_cache_name") else "past_key_values"


def output_cache(out):
    """The cache of a model output, under either name."""
    return out.cache if CACHE_ARG == "cache" else out.past_key_values


def additive_mask(attention_mask: torch.Tensor, window_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """attention_mask [B, P+W] int64, window_mask [B, W, W] bool -> [B, 1, W, P+W] additive float mask."""
    window = window_mask.shape[-1]
    past = attention_mask.shape[-1] - window
    keep = attention_mask.bool()
    prefix = keep[:, None, :past].expand(-1, window, -1)  # [B, W, P]
    inside = window_mask & keep[:, None, past:]  # [B, W, W]
    allowed = torch.cat([prefix, inside], dim=-1)[:, None]  # [B, 1, W, P+W]
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return torch.where(allowed, torch.zeros((), dtype=dtype), blocked)


class WindowModel(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, position_ids, attention_mask, window_mask, *past):
        dtype = past[0].dtype
        cache = DynamicCache()
        for i in range(self.num_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=additive_mask(attention_mask, window_mask, dtype),
            use_cache=True,
            **{CACHE_ARG: cache},
        )
        logits = out.logits.float()  # [B, W, vocab]
        greedy_ids = logits.argmax(dim=-1)  # [B, W]
        present = []
        for layer in output_cache(out).layers[: self.num_layers]:
            present += [layer.keys, layer.values]  # [B, kv_heads, P+W, head_dim]
        return (logits, greedy_ids, *present)
