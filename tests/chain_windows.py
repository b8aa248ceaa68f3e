"""A chain window against the same tokens one pass at a time: what every exactness test compares."""

from __future__ import annotations

import numpy as np


def window_and_one_token_passes(ctx, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The logits of `tokens` as one chain window after `ctx`'s committed entries, and the logits of
    the same tokens fed one pass each; `ctx` is left at the length it had."""
    start = ctx.length
    window = ctx.forward(tokens[None], want_logits=True).logits[0]
    ctx.commit(0)
    alone = []
    for token in tokens:
        alone.append(ctx.forward(np.array([[token]]), want_logits=True).logits[0, 0])
        ctx.commit(1)
    ctx.trim(start)
    return window, np.stack(alone)
