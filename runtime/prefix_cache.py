"""The prefix cache: what a finished row computed (its tokens' KV and its proposer's state) stays where it was
written until that place is needed, and a new request whose prompt shares a prefix with it prefills only the rest.

A chat client sends the whole conversation every turn; the previous turn's row already wrote the KV of all of it
but the newest messages. One `PrefixCache` keeps a `Kept` per place:
- a batcher's idle slot (runtime/batcher.py): the place is the slot's index in the batcher's context;
- a lone call's context (no batcher started): the place is the context, which the `Kept` owns
  (`Generator.lone_cache`, at most `prefix_cache.contexts` of them).

On admission the place whose tokens share the longest prefix (token ids) with the new prompt is taken:

    reuse = min(common prefix, len(prompt) - 1)      the prompt's last token always runs: its logits
                                                     give the first new token
    the place is trimmed to `reuse` entries; the row prefills prompt[reuse:]

The policy (one place, `PrefixCache.hit`):
- a hit needs at least `min_tokens` shared tokens (below that the copy of a slot costs more than
  the few prefill tokens it saves); a hit that reuses less than half of a kept place (another
  conversation's shared system prompt) is taken only when no never-used place is left, so it does
  not destroy a conversation that may come back;
- without a hit, a never-used slot is taken first, then the least recently used kept one (evicted);
  a lone call opens a new context, and the least recently used beyond `contexts` are closed;
- a kept slot is moved (the batcher's `swap_rows`) to where the rows are packed; no slot is copied
  into two (a long shared system prompt is reused by whichever conversation comes next, not
  duplicated: a copy costs as much memory as the prefix and would evict another conversation).

The proposer's state travels with the place (`Proposer.handover()` / `adopt()`): lookahead's n-gram
pool, a draft's cache and tokens, so the next turn's guesses start warm.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .acceptance import matched_prefix
from .config import PrefixCacheConfig
from .proposers import close_state


@dataclass
class Kept:
    """What a finished row left in an idle place."""

    tokens: list[int]  # the tokens whose KV the place holds, in order (its length)
    proposer: Any = None  # the finished row's proposer state (Proposer.handover)
    used: int = 0  # when it was last used (a counter): the least recent is evicted first
    context: Any = None  # a lone call's context, which holds the KV (None: a slot of the batcher's context)

    def close(self) -> None:
        close_state(self.proposer)
        if self.context is not None:
            self.context.close()


@dataclass
class Choice:
    place: Any  # where the new row runs: an idle slot, or a lone call's kept context
    reuse: int  # prompt tokens whose KV the place already holds (0: prefill all)
    kept: Kept | None  # what the place held on a hit (None: a never-used slot, or one evicted for the row)


@dataclass
class PrefixCache:
    """The kept places of one batcher (slot indices) or of a generator's lone calls (contexts).
    `enabled=False`: nothing is kept."""

    enabled: bool = True
    config: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)  # min_tokens, guesses (runtime.config)
    kept: dict[Any, Kept] = field(default_factory=dict)
    queries: int = 0  # admissions looked up
    hits: int = 0  # admissions that reused a prefix
    cached_tokens: int = 0  # prompt tokens not prefilled thanks to the cache
    _clock: itertools.count = field(default_factory=itertools.count, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)  # lone calls come from any thread

    def keep(self, place: Any, tokens: list[int], proposer: Any = None) -> None:
        if not self.config.guesses and proposer:
            close_state(proposer)
            proposer = None
        if self.enabled and tokens:
            self.kept[place] = Kept(tokens, proposer, next(self._clock))

    def hit(self, prompt: Sequence[int], places: Collection) -> Choice | None:
        """The kept place of `places` sharing the longest prefix with `prompt` (the first of equals), taken out of
        the cache; None when the policy finds no hit."""
        if not self.enabled:
            return None
        self.queries += 1
        kept = [place for place in places if place in self.kept]
        best, shared = longest_prefix(prompt, [(place, self.kept[place].tokens) for place in kept])
        reuse = min(shared, len(prompt) - 1)
        # A hit that would throw away more of a kept conversation than it reuses waits for the places to run out.
        wasteful = best is not None and 2 * shared < len(self.kept[best].tokens) and len(kept) < len(places)
        if best is None or reuse < self.config.min_tokens or wasteful:
            return None
        self.hits += 1
        self.cached_tokens += reuse
        return Choice(best, reuse, self.kept.pop(best))

    def choose(self, prompt: Sequence[int], idle: range) -> Choice:
        """The idle slot for a new row of `prompt`, and how much of the prompt it already holds."""
        return self.hit(prompt, idle) or Choice(self.unused(idle), 0, None)

    def unused(self, places: Sequence) -> Any:
        """The first never-used of `places`, else the least recently kept one (evicted)."""
        free = [place for place in places if place not in self.kept]
        return free[0] if free else self.evict(places)

    def evict(self, places: Collection) -> Any:
        """Forget the least recently kept of `places` (all kept), releasing what it holds; returns the place."""
        oldest = min(places, key=lambda place: self.kept[place].used)
        self.kept.pop(oldest).close()
        return oldest

    def swap(self, a: int, b: int) -> None:
        ka, kb = self.kept.pop(a, None), self.kept.pop(b, None)
        if ka is not None:
            self.kept[b] = ka
        if kb is not None:
            self.kept[a] = kb

    def clear(self) -> None:
        """Forget every kept place, releasing what each holds."""
        with self._lock:
            kept, self.kept = list(self.kept.values()), {}
        for each in kept:
            each.close()

    # -- lone calls: each place is a context of its own ------------------------------------------------

    def context_for(
        self, prompt: Sequence[int], capacity: int, open_context: Callable[[int], Any]
    ) -> tuple[Any, PrefixCache]:
        """A lone call's context of at least `capacity` for `prompt`: the kept one sharing the longest prefix
        (its prefix copied into a new one when it is too small: `load_prefix`), else a new one; and the
        one-slot cache its batcher seats the row with."""
        with self._lock:
            choice = self.hit(prompt, sorted(self.kept, key=lambda ctx: -self.kept[ctx].used))  # latest first
        one = PrefixCache(self.enabled, self.config)
        if choice is None:
            return open_context(capacity), one
        ctx, kept = choice.place, replace(choice.kept, context=None)
        if ctx.capacity < capacity:  # the conversation grew past the kept context: copy its prefix over
            bigger = open_context(capacity)
            if bigger.load_prefix(ctx, choice.reuse):
                kept.tokens = kept.tokens[: choice.reuse]
            else:
                kept.close()
                kept = None
            ctx.close()
            ctx = bigger
        if kept is not None:
            one.kept[0] = kept
        return ctx, one

    def keep_context(self, ctx: Any, one: PrefixCache) -> None:
        """Keep `ctx` with what its row left in `one` (closing the least recently used beyond
        `config.contexts`), or close it when its row left nothing."""
        kept = one.kept.pop(0, None)
        if kept is None:
            ctx.close()
            return
        with self._lock:
            self.kept[ctx] = replace(kept, used=next(self._clock), context=ctx)
            while len(self.kept) > self.config.contexts:
                self.evict(list(self.kept))


def longest_prefix(prompt: Sequence[int], candidates: list[tuple[Any, list[int]]]) -> tuple[Any, int]:
    """Of `candidates` (key, tokens), the key sharing the longest prefix with `prompt` (the first of equals)
    and that prefix's length; (None, 0) when none shares a token. PrefixCache.hit."""
    best, best_n = None, 0
    for key, tokens in candidates:
        n = matched_prefix(tokens, prompt)
        if n > best_n:
            best, best_n = key, n
    return best, best_n
