"""N-gram guess sources: prompt lookup and the lookahead n-gram pool.

Token ids only; every structure is updated incrementally (no rescans of the sequence), so
proposing costs microseconds, not milliseconds, at a few thousand tokens of context.

    lookup, pool = PromptLookup(), NgramPool()
    lookup.extend(prompt); pool.extend(prompt)
    found = lookup.lookup(None, k=15) + pool.lookup(lookup.tokens[-2:], k=15)   # then runtime.proposers
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Candidate:
    """A guessed continuation of the committed sequence, and where it came from."""

    tokens: list[int]
    source: str  # "prompt", "pool" or "jacobi": the tracker's statistics are kept per source
    match_len: int  # how many trailing committed tokens the source matched (0: no match needed)


# ---------------------------------------------------------------------------------------------
# Prompt lookup


class PromptLookup:
    """Index of every n-gram (n_min..n_max tokens) of the committed sequence (prompt + output).

    For each n-gram it keeps up to `occurrences` recent positions where it was followed by a token,
    at most one per distinct next token (the most recent), so one key offers distinct branches.
    """

    def __init__(self, n_min: int = 1, n_max: int = 4, occurrences: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max, self.occurrences = n_min, n_max, occurrences
        self.tokens: list[int] = []
        self.index: dict[
            tuple[int, ...], list[int]
        ] = {}  # n-gram -> start positions of its continuations, oldest first
        self.work = 0  # n-gram insertions done so far: lets tests check the indexing is incremental

    def reset(self) -> None:
        self.tokens, self.index, self.work = [], {}, 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens; indexes only the n-grams they complete."""
        seq = self.tokens
        for token in map(int, tokens):
            end = len(seq)  # the new token's position: where the continuation of the n-grams before it starts
            seq.append(token)
            for n in range(self.n_min, min(self.n_max, end) + 1):
                starts = self.index.setdefault(tuple(seq[end - n : end]), [])
                # One position per distinct next token: the newest occurrence replaces an older one.
                for i, start in enumerate(starts):
                    if seq[start] == token:
                        del starts[i]
                        break
                starts.append(end)
                if len(starts) > self.occurrences:
                    del starts[0]
                self.work += 1

    def lookup(self, tail: Sequence[int] | None, k: int, limit: int = 1) -> list[Candidate]:
        """Up to `limit` distinct continuations (each up to k tokens) of the longest matching suffix of `tail`.

        `tail` defaults to the committed sequence's end (a continuation that runs into the end is
        extended periodically, which is only meaningful for that tail). Longer matches come first,
        then within a match length the most recent occurrence; shorter matches fill the remaining slots.
        """
        if tail is None:
            tail = self.tokens[-self.n_max :]
        if k <= 0 or limit <= 0 or not tail:
            return []
        found: dict[tuple[int, ...], Candidate] = {}  # by tokens: the first of equal continuations
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            for start in reversed(self.index.get(tuple(tail[len(tail) - n :]), ())):
                # Past the sequence's end, keep copying with the same offset: a match that overlaps the
                # end is a repeat, and its continuation repeats too ("a b a b" -> "a b a b ...").
                tokens = self.tokens[start : start + k]
                while len(tokens) < k:
                    tokens.append(tokens[start + len(tokens) - len(self.tokens)])
                found.setdefault(tuple(tokens), Candidate(tokens, "prompt", n))
                if len(found) == limit:
                    return list(found.values())
        return list(found.values())


# ---------------------------------------------------------------------------------------------
# Lookahead n-gram pool


class NgramPool:
    """Lookahead decoding's n-gram pool: continuations keyed by the 1 and 2 tokens before them.

    Filled from the committed text and from each pass's Jacobi trajectory (the target's
    predictions, rejected ones included). Each key holds at most `per_key` continuations of up to
    `span` tokens, most recently seen first.
    """

    def __init__(self, per_key: int = 8, span: int = 8) -> None:
        self.per_key, self.span = per_key, span
        self.table: dict[tuple[int, ...], list[list[int]]] = {}
        self.tokens: list[int] = []  # committed text not yet indexed, plus the 2 tokens before it
        self._next = 1  # index in self.tokens of the first unindexed position (position 0 has no key)
        self.work = 0

    def reset(self) -> None:
        self.table, self.tokens, self._next, self.work = {}, [], 1, 0

    def restart(self) -> None:
        """A new sequence with the n-grams seen so far kept (the next turn of a conversation)."""
        self.tokens, self._next = [], 1

    def add(self, before: Sequence[int], continuation: Sequence[int]) -> None:
        """Record that `continuation` followed `before` (its last 1 and 2 tokens become the keys)."""
        continuation = list(continuation[: self.span])
        for n in (1, 2)[: len(before)] if continuation else ():
            self._insert(tuple(before[-n:]), continuation)

    def _insert(self, key: tuple[int, ...], continuation: list[int]) -> None:
        entries = self.table.setdefault(key, [])
        for i, old in enumerate(entries):
            # A continuation that extends a known one (or is extended by it) is the same n-gram: keep the longer.
            if old[: len(continuation)] == continuation or continuation[: len(old)] == old:
                continuation = max(continuation, old, key=len)
                del entries[i]
                break
        entries.insert(0, continuation)
        del entries[self.per_key :]
        self.work += 1

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens. A position is indexed once `span` tokens follow it (the prompt
        lookup covers the most recent text without delay)."""
        seq, span = self.tokens, self.span
        seq.extend(int(t) for t in tokens)
        start, stop = self._next, len(seq) - span + 1  # positions < stop have a full continuation
        for pos in range(start, stop):
            self.add(seq[max(0, pos - 2) : pos], seq[pos : pos + span])
        self._next = max(start, stop)
        drop = max(0, self._next - 2)  # keep the 2 tokens of context before the first unindexed position
        del seq[:drop]
        self._next -= drop

    def observe(self, context: Sequence[int], guesses: Sequence[int], predictions: Sequence[int]) -> None:
        """Harvest n-grams from one pass over [context[-1], *guesses] that gave `predictions`.

        predictions[j] is what the target says follows window entry j, given the entries before
        it (some possibly wrong guesses: lookahead's noisy n-grams, often right later). The
        continuation runs on through predictions[j+1], ... while each window entry equals the
        previous prediction, so it is one chain the target agrees with.
        """
        window = [*context[-2:], *guesses]
        offset = len(window) - len(guesses) - 1  # window index of context[-1]
        for j in range(len(predictions)):
            chain = [predictions[j]]
            i = j + 1
            while i < len(predictions) and len(chain) < self.span and window[offset + i] == predictions[i - 1]:
                chain.append(predictions[i])
                i += 1
            self.add(window[max(0, offset + j - 1) : offset + j + 1], chain)

    def lookup(self, last_tokens: Sequence[int], k: int, limit: int = 1, chain: bool = True) -> list[Candidate]:
        """Up to `limit` continuations after `last_tokens` (2-token key first, then 1-token), each up to k tokens.

        With `chain`, a continuation shorter than k is extended by repeatedly looking up its own
        last two tokens (most recent entry each time).
        """
        if k <= 0 or limit <= 0 or not last_tokens:
            return []
        found: dict[tuple[int, ...], Candidate] = {}  # by tokens: the first of equal continuations
        for n in (2, 1) if len(last_tokens) >= 2 else (1,):
            for entry in self.table.get(tuple(last_tokens[-n:]), ()):
                tokens = self._chain(list(last_tokens[-2:]), entry, k) if chain else entry[:k]
                found.setdefault(tuple(tokens), Candidate(tokens, "pool", n))
                if len(found) == limit:
                    return list(found.values())
        return list(found.values())

    def _chain(self, context: list[int], entry: list[int], k: int) -> list[int]:
        seq, head = context + entry, len(context)
        while len(seq) - head < k:
            entries = self.table.get((seq[-2], seq[-1]))
            if not entries:
                break
            seq.extend(entries[0][: k - (len(seq) - head)])
        return seq[head : head + k]
