"""The prefix cache: a finished row's slot keeps its tokens' KV (and its proposer's state) until the
slot is needed, and a new request whose prompt shares a prefix with it prefills only the rest.

A chat client sends the whole conversation every turn; the previous turn's row already wrote the
KV of all of it but the newest messages. So the batcher (runtime/batcher.py) keeps what a finished
row leaves in its slot, here as a `Kept` per idle slot, and on admission takes the idle slot whose
tokens share the longest prefix (token ids) with the new prompt:

    reuse = min(common prefix, len(prompt) - 1)      the prompt's last token always runs: its logits
                                                     give the first new token
    the slot is trimmed to `reuse` entries; the row prefills prompt[reuse:]

The policy (one place, `PrefixCache.choose`):
- a hit needs at least `min_tokens` shared tokens (below that the copy of a slot costs more than
  the few prefill tokens it saves); a hit that reuses less than half of a kept slot (another
  conversation's shared system prompt) is taken only when no never-used slot is left, so it does
  not destroy a conversation that may come back;
- without a hit, a never-used slot is taken first, then the least recently used kept one (evicted);
- a kept slot is moved (the batcher's `swap_rows`) to where the rows are packed; no slot is copied
  into two (a long shared system prompt is reused by whichever conversation comes next, not
  duplicated: a copy costs as much memory as the prefix and would evict another conversation).

The proposer's state travels with the slot (`Proposer.handover()` / `adopt()`): lookahead's n-gram
pool, a draft's cache and tokens, so the next turn's guesses start warm.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .acceptance import matched_prefix
from .config import PrefixCacheConfig
from .proposers import close_state


@dataclass
class Kept:
    """What a finished row left in an idle slot."""

    tokens: list[int]  # the tokens whose KV the slot holds, in order (its length)
    proposer: Any = None  # the finished row's proposer state (Proposer.handover)
    used: int = 0  # when it was last used (a counter): the least recent is evicted first


@dataclass
class Choice:
    slot: int  # the idle slot the new row takes (its KV kept or not)
    reuse: int  # prompt tokens whose KV the slot already holds (0: prefill all)
    kept: Kept | None  # what the slot held on a hit (None: a never-used slot, or one evicted for the row)


@dataclass
class PrefixCache:
    """The kept slots of one batcher, by slot index. `enabled=False`: nothing is kept."""

    enabled: bool = True
    config: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)  # min_tokens, guesses (runtime.config)
    kept: dict[int, Kept] = field(default_factory=dict)
    queries: int = 0  # admissions looked up
    hits: int = 0  # admissions that reused a prefix
    cached_tokens: int = 0  # prompt tokens not prefilled thanks to the cache
    _clock: itertools.count = field(default_factory=itertools.count, repr=False)

    def keep(self, slot: int, tokens: list[int], proposer: Any = None) -> None:
        if not self.config.guesses and proposer:
            close_state(proposer)
            proposer = None
        if self.enabled and tokens:
            self.kept[slot] = Kept(tokens, proposer, next(self._clock))

    def choose(self, prompt: Sequence[int], idle: range) -> Choice:
        """The idle slot for a new row of `prompt`, and how much of the prompt it already holds."""
        if not self.enabled:
            return Choice(idle.start, 0, None)
        self.queries += 1
        best, best_n = longest_prefix(prompt, [(slot, self.kept[slot].tokens) for slot in idle if slot in self.kept])
        reuse = min(best_n, len(prompt) - 1)
        free = [slot for slot in idle if slot not in self.kept]
        # A hit that would throw away more of a kept conversation than it reuses waits for the slots to run out.
        wasteful = best is not None and 2 * best_n < len(self.kept[best].tokens) and free
        if best is not None and reuse >= self.config.min_tokens and not wasteful:
            self.hits += 1
            self.cached_tokens += reuse
            return Choice(best, reuse, self.kept.pop(best))
        return Choice(free[0] if free else self.evict(idle), 0, None)

    def evict(self, slots: range) -> int:
        """Forget the least recently kept of `slots` (all kept); returns its slot."""
        oldest = min(slots, key=lambda slot: self.kept[slot].used)
        close_state(self.kept.pop(oldest).proposer)
        return oldest

    def swap(self, a: int, b: int) -> None:
        ka, kb = self.kept.pop(a, None), self.kept.pop(b, None)
        if ka is not None:
            self.kept[b] = ka
        if kb is not None:
            self.kept[a] = kb

    def clear(self) -> list[Kept]:
        """Forget every kept slot; returns them (their proposer states to release)."""
        out, self.kept = list(self.kept.values()), {}
        return out


class KeptContexts:
    """The prefix cache of lone calls (no batcher started): each call's context is kept after it, at most
    `config.contexts` of them, the least recently used closed first (None: none). A call whose prompt shares
    at least `config.min_tokens` with a kept one runs on it (trimmed to the shared prefix), or, when it needs more room,
    on a new context the prefix is copied into (`load_prefix`: the in-place graph's contexts)."""

    def __init__(self, config: PrefixCacheConfig | None):
        self.config = config or PrefixCacheConfig()
        self.most = config.contexts if config else 0
        self.entries: list[tuple[Any, Kept]] = []  # (context, what its one row holds), oldest first
        self._lock = threading.Lock()

    def take(self, prompt: Sequence[int], capacity: int, open_context) -> tuple[Any, PrefixCache]:
        """A context of at least `capacity` for `prompt`, and the one-slot cache the batcher seats the row with."""
        with self._lock:
            latest_first = [(i, kept.tokens) for i, (_, kept) in reversed(list(enumerate(self.entries)))]
            i, n = longest_prefix(prompt, latest_first)
            hit = min(n, len(prompt) - 1) >= self.config.min_tokens
            ctx, kept = self.entries.pop(i) if hit else (None, None)
        cache = PrefixCache(config=self.config)
        if ctx is None:
            return open_context(capacity), cache
        if ctx.capacity < capacity:  # the conversation grew past the kept context: copy its prefix over
            bigger = open_context(capacity)
            if bigger.load_prefix(ctx, n):
                kept = Kept(kept.tokens[:n], kept.proposer, kept.used)
            else:
                close_state(kept.proposer)
                kept = None
            ctx.close()
            ctx = bigger
        if kept is not None:
            cache.kept[0] = kept
        return ctx, cache

    def put(self, ctx, cache: PrefixCache) -> None:
        """Keep `ctx` with what its row left (or close it when it left nothing)."""
        kept = cache.kept.pop(0, None)
        if kept is None:
            ctx.close()
            return
        with self._lock:
            self.entries.append((ctx, kept))
            evicted = self.entries[: max(0, len(self.entries) - self.most)]
            del self.entries[: len(evicted)]
        for old, old_kept in evicted:
            old.close()
            close_state(old_kept.proposer)

    def close(self) -> None:
        with self._lock:
            entries, self.entries = self.entries, []
        for ctx, kept in entries:
            ctx.close()
            close_state(kept.proposer)


def longest_prefix(prompt: Sequence[int], candidates: list[tuple[Any, list[int]]]) -> tuple[Any, int]:
    """Of `candidates` (key, tokens), the key sharing the longest prefix with `prompt` (the first of equals)
    and that prefix's length; (None, 0) when none shares a token. PrefixCache.choose and KeptContexts.take."""
    best, best_n = None, 0
    for key, tokens in candidates:
        n = matched_prefix(tokens, prompt)
        if n > best_n:
            best, best_n = key, n
    return best, best_n
