"""Plain one-token constrained decoding through a backend context: the oracle every strategy must equal.

One token a pass, the logits of that pass, the grammar's mask after the committed tokens, the pick
(greedy: the most likely allowed token; sampled: runtime.sampling's rule on the allowed tokens),
then the matcher and the context advance by that token. Nothing here is shared with the engine's
integration, so the two can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jacobi_rt.runtime.constraints import Matcher
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


def constrained_decode(backend, prompt: list[int], matcher: Matcher, max_new_tokens: int,
                       sampling: SamplingParams | None = None) -> Constrained:
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
            if token in matcher.eos_ids:
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


def constrained_tree_decode(backend, prompt: list[int], matcher: Matcher, max_new_tokens: int,
                            sampling: SamplingParams | None = None, window: int = 8) -> TreeRun:
    """The engine's integration in miniature, with Phase 1's interface only: each pass sends the
    forced run (Matcher.constrain) followed by the last pass's picks past the accepted point (plain
    Jacobi), plus that Jacobi guess alone as a second branch when it leaves the forced run; every row
    is picked under its own mask (Matcher.masks); the picks are walked (Tree.accept); the matcher
    commits the verdict. Its output must be constrained_decode's, token for token."""
    from jacobi_rt.runtime.allocator import Guess, Offer
    from jacobi_rt.runtime.tree import build_tree

    sampler = Sampler(sampling, len(prompt)) if sampling is not None and not sampling.greedy else None
    run = TreeRun([], "length", 0)
    with backend.context(len(prompt) + max_new_tokens + window + 1) as ctx:
        step = ctx.forward(np.array([prompt], dtype=np.int64), want_logits=True)
        ctx.commit(len(prompt))
        history = list(prompt)
        new = [_pick(sampler, step.logits[0, -1], int(step.greedy_ids[0, -1]), matcher.masks([prompt[-1]], [-1]), 0,
                     history, len(history))]
        tail: list[int] = []
        while True:
            # `new` is committed; the KV of its last token (the next root) is written by the next pass
            eos = next((i for i, t in enumerate(new) if t in matcher.eos_ids), None)
            new = new if eos is None else new[: eos + 1]
            matcher.commit(new)
            history += new
            run.ids += new
            if eos is not None or len(run.ids) >= max_new_tokens:
                run.finish_reason = "eos" if eos is not None else "length"
                run.ids = run.ids[:max_new_tokens]
                return run
            forced = matcher.forced()
            offer = matcher.constrain(Offer((Guess((0.5,) * len(tail), tuple(tail)),) if tail else ()))
            branches = [list(g.tokens) for g in offer.offer.guesses]
            alone = tail[: matcher.cut(tail)]
            if forced and alone and alone[: len(forced)] != forced:
                branches.append(alone)  # a second branch, so that trees are exercised too
            tree = build_tree(history[-1], branches, max_nodes=min(window, max_new_tokens - len(run.ids) + 1))
            first = 0  # rows 1..first: the first branch, a chain
            while first + 1 < len(tree.parents) and tree.parents[first + 1] == first:
                first += 1
            run.forced_sent += _common(tree.tokens[1 : first + 1], forced)
            masks = matcher.masks(tree.tokens, tree.parents)
            positions = np.array([[ctx.length + p for p in tree.positions]], dtype=np.int64)
            step = ctx.forward(np.array([tree.tokens], dtype=np.int64), positions, tree.window_mask[None], want_logits=True)
            run.passes += 1
            paths: list[list[int]] = []
            picks = []
            for node, parent in enumerate(tree.parents):
                paths.append([] if parent < 0 else [*paths[parent], tree.tokens[node]])
                prefix = history + paths[node]
                picks.append(_pick(sampler, step.logits[0, node], int(step.greedy_ids[0, node]), masks, node, prefix, len(prefix)))
            verdict = tree.accept(picks)
            if verdict.contiguous:
                ctx.commit(len(verdict.keep))
            else:
                ctx.commit_rows(verdict.keep)
            run.forced_committed += _common([tree.tokens[i] for i in verdict.path], forced)
            along_first = verdict.path == list(range(1, len(verdict.path) + 1))
            tail = picks[len(verdict.path) + 1 : first + 1] if along_first else []
            new = list(verdict.committed)


def _pick(sampler, logits, greedy: int, masks, node: int, prefix: list[int], position: int) -> int:
    if not masks.live[node]:
        return greedy  # never reached by the accept walk
    allowed = masks.allowed(node)
    return masked_greedy(logits, greedy, allowed) if sampler is None else sampler.sample(logits, prefix, position, allowed)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
