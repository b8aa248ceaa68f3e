"""Plain one-token constrained decoding through a backend context: the oracle every strategy must equal.

One token a pass, the logits of that pass, the grammar's mask after the committed tokens, the pick
(greedy: the most likely allowed token; sampled: runtime.sampling's rule on the allowed tokens),
then the matcher and the context advance by that token. Nothing here is shared with the engine's
integration, so the two can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jacobi_rt.runtime.grammar import Matcher
from jacobi_rt.runtime.sampling import Sampler, SamplingParams, masked_greedy


@dataclass
class Constrained:
    """What constrained_decode produced."""

    ids: list[int]  # the new tokens, an EOS included when one ended the output
    finish_reason: str  # "eos" (the grammar was complete and EOS was picked) or "length"
    forced_hits: int = 0  # picks that equalled the first token the grammar forced there
    forced_offers: int = 0  # positions where the grammar forced a token
    forced_runs: list[tuple[int, int]] = field(default_factory=list)  # (forced run's length, tokens of it picked)
    mask_seconds: list[float] = field(default_factory=list)  # one per pass
    greedy_refused: int = 0  # passes whose unconstrained greedy id the grammar refused (the logits were needed)


def constrained_decode(
    backend, prompt: list[int], matcher: Matcher, max_new_tokens: int, sampling: SamplingParams | None = None
) -> Constrained:
    """Decode `max_new_tokens` at most after `prompt`, one token a pass, every pick masked by `matcher`."""
    sampler = Sampler(sampling, len(prompt)) if sampling is not None and not sampling.greedy else None
    out = Constrained([], "length")
    pending_run: list[int] = []
    with backend.context(len(prompt) + max_new_tokens + 1) as ctx:
        step = ctx.forward(np.array([prompt], dtype=np.int64), want_logits=True)
        ctx.commit(len(prompt))
        for _ in range(max_new_tokens):
            logits, greedy = step.logits[0, -1], int(step.greedy_ids[0, -1])
            forced = matcher.forced()
            masks = matcher.masks([prompt[-1] if not out.ids else out.ids[-1]], [-1])
            out.mask_seconds.append(masks.seconds)
            allowed = masks.allowed(0)
            out.greedy_refused += not allowed[greedy]
            if sampler is None:
                token = masked_greedy(logits, greedy, allowed)
            else:
                prefix = prompt + out.ids
                token = sampler.sample(logits, prefix, len(prefix), allowed)
            if forced:
                out.forced_offers += 1
                out.forced_hits += token == forced[0]
                if not pending_run:
                    pending_run = forced
                    out.forced_runs.append((len(forced), 0))
            if pending_run:
                if token == pending_run[0]:
                    run, hit = out.forced_runs[-1]
                    out.forced_runs[-1] = (run, hit + 1)
                    pending_run = pending_run[1:]
                else:
                    pending_run = []
            matcher.commit([token])
            out.ids.append(token)
            if token in matcher.bridge.eos_ids:
                out.finish_reason = "eos"
                break
            step = ctx.forward(np.array([[token]], dtype=np.int64), want_logits=True)
            ctx.commit(1)
    return out


@dataclass
class TreeRun:
    """What constrained_tree_decode produced."""

    ids: list[int]
    finish_reason: str
    passes: int
    forced_sent: int = 0  # forced tokens put in windows
    forced_committed: int = 0  # of those, committed
