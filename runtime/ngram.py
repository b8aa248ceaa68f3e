"""N-gram guess sources for the decoding loop: prompt lookup, a lookahead n-gram pool, an
acceptance tracker that decides how many guesses are worth a pass, and branch trees that verify
several candidate continuations in one pass.

Token ids only; every structure is updated incrementally (no rescans of the sequence), so
proposing costs microseconds, not milliseconds, at a few thousand tokens of context.

    lookup, pool, tracker = PromptLookup(), NgramPool(), AcceptanceTracker()
    lookup.extend(prompt); pool.extend(prompt)
    cands = lookup.lookup(None, k=15) + pool.lookup(lookup.tokens[-2:], k=15)
    best, length = tracker.choose(cands, k=15)          # length 0: send no guesses (greedy pass)
    tree = build_tree(last, [best.tokens[:length]])      # or several candidates at once
    ... one target pass over tree.tokens with tree.positions and tree.window_mask ...
    verdict = tree.accept(predictions)                   # committed tokens == greedy decoding
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .proposers import Proposer

# Relative cost of one target pass of window W vs W=1, SmolLM2-135M fp32 on 2 CPU cores
# (docs: facts.md). Measure and pass your own table on other hardware: on a GPU it is much flatter.
CPU_PASS_COSTS: dict[int, float] = {1: 1.0, 4: 1.25, 8: 1.6, 16: 1.85, 32: 2.9}


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
        self.index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> start positions of its continuations, oldest first
        self.work = 0  # n-gram insertions done so far: lets tests check the indexing is incremental

    def reset(self) -> None:
        self.tokens, self.index, self.work = [], {}, 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens; indexes only the n-grams they complete."""
        for token in tokens:
            self._append(int(token))

    def _append(self, token: int) -> None:
        seq = self.tokens
        end = len(seq)  # the new token's position = where the continuation of n-grams ending just before starts
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
        found: list[Candidate] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            starts = self.index.get(tuple(tail[len(tail) - n :]), ())
            for start in reversed(starts):
                tokens = self._continuation(start, k)
                if tuple(tokens) not in seen:
                    seen.add(tuple(tokens))
                    found.append(Candidate(tokens, "prompt", n))
                    if len(found) == limit:
                        return found
        return found

    def candidates(self, tail: Sequence[int] | None, k: int, limit: int = 1) -> list[list[int]]:
        """`lookup` without the bookkeeping: the continuations' tokens."""
        return [c.tokens for c in self.lookup(tail, k, limit)]

    def _continuation(self, start: int, k: int) -> list[int]:
        # Past the sequence's end, keep copying with the same offset: a match that overlaps the
        # end is a repeat, and its continuation repeats too ("a b a b" -> "a b a b ...").
        seq, end = self.tokens, len(self.tokens)
        out = seq[start : start + k]
        while len(out) < k:
            out.append(out[start + len(out) - end])
        return out


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

    def add(self, before: Sequence[int], continuation: Sequence[int]) -> None:
        """Record that `continuation` followed `before` (its last 1 and 2 tokens become the keys)."""
        continuation = list(continuation[: self.span])
        if not continuation or not before:
            return
        self._insert((before[-1],), continuation)
        if len(before) >= 2:
            self._insert((before[-2], before[-1]), continuation)

    def _insert(self, key: tuple[int, ...], continuation: list[int]) -> None:
        entries = self.table.setdefault(key, [])
        for i, old in enumerate(entries):
            # A continuation that extends a known one (or is extended by it) is the same n-gram: keep the longer.
            if old[: len(continuation)] == continuation or continuation[: len(old)] == old:
                if len(old) > len(continuation):
                    continuation = old
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
        found: list[Candidate] = []
        seen: set[tuple[int, ...]] = set()
        for n in (2, 1):
            if len(last_tokens) < n:
                continue
            for entry in self.table.get(tuple(last_tokens[-n:]), ()):
                tokens = self._chain(list(last_tokens[-2:]), entry, k) if chain else entry[:k]
                if tuple(tokens) not in seen:
                    seen.add(tuple(tokens))
                    found.append(Candidate(tokens, "pool", n))
                    if len(found) == limit:
                        return found
        return found

    def candidates(self, last_tokens: Sequence[int], k: int, limit: int = 1) -> list[list[int]]:
        """`lookup` without the bookkeeping: the continuations' tokens."""
        return [c.tokens for c in self.lookup(last_tokens, k, limit)]

    def _chain(self, context: list[int], entry: list[int], k: int) -> list[int]:
        seq, head = context + entry, len(context)
        while len(seq) - head < k:
            entries = self.table.get((seq[-2], seq[-1]))
            if not entries:
                break
            seq.extend(entries[0][: k - (len(seq) - head)])
        return seq[head : head + k]


# ---------------------------------------------------------------------------------------------
# Acceptance tracking: how many guesses are worth sending


def pass_cost(window: int, costs: dict[int, float] = CPU_PASS_COSTS) -> float:
    """Relative cost of a pass of `window` tokens: piecewise-linear in the table, extrapolated past its ends."""
    points = sorted(costs.items())
    if len(points) == 1:
        return points[0][1]
    for (w0, c0), (w1, c1) in zip(points, points[1:]):
        if window <= w1 or (w1, c1) == points[-1]:
            return c0 + (c1 - c0) * (window - w0) / (w1 - w0)
    raise AssertionError("unreachable")


def matched_prefix(tokens: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading tokens of a guess equal the committed tokens."""
    n = 0
    for guess, token in zip(tokens, committed):
        if guess != token:
            break
        n += 1
    return n


@dataclass
class Rate:
    """Decayed counts of guessed tokens tried and right, for one (source, match length)."""

    right: float
    tried: float

    @property
    def p(self) -> float:
        """Chance that a guess is right given the guesses before it were (geometric model)."""
        return self.right / self.tried


@dataclass
class AcceptanceTracker:
    """Per source and match length, the chance p that the next guessed token is right when the
    previous ones were; sending L guesses then yields 1 + p + p^2 + ... + p^L tokens per pass.

    `suggest_length` picks the L that maximises tokens per unit of pass cost, 0 when no L beats
    a plain greedy pass by `margin`. Every candidate, sent or not, is scored against the tokens
    the pass committed, so a source that is not being sent keeps being measured for free.
    """

    costs: dict[int, float] = field(default_factory=lambda: dict(CPU_PASS_COSTS))
    prior: float = 0.5  # p before any evidence
    prior_weight: float = 2.0  # worth that many tried tokens
    decay: float = 0.9  # per scoring: old evidence fades, so the rate follows the text
    max_match: int = 4  # match lengths above this share one statistic
    margin: float = 0.03  # required gain over greedy, against noise in the cost table
    rates: dict[tuple[str, int], Rate] = field(default_factory=dict)
    _costs: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def rate(self, source: str, match_len: int) -> Rate:
        key = (source, min(match_len, self.max_match))
        if key not in self.rates:
            self.rates[key] = Rate(self.prior * self.prior_weight, self.prior_weight)
        return self.rates[key]

    def score(self, candidate: Candidate, committed: Sequence[int]) -> None:
        """Learn from one pass: compare the candidate with the tokens the pass committed.

        Guesses up to and including the first wrong one were tried; those after it, or beyond
        the committed tokens, tell nothing and are not counted.
        """
        right = matched_prefix(candidate.tokens, committed)
        tried = right + (right < min(len(candidate.tokens), len(committed)))
        if tried == 0:
            return
        rate = self.rate(candidate.source, candidate.match_len)
        rate.right = rate.right * self.decay + right
        rate.tried = rate.tried * self.decay + tried

    def cost(self, window: int) -> float:
        """Relative cost of a pass of `window` tokens (memoised `pass_cost` of `costs`)."""
        if window not in self._costs:
            self._costs[window] = pass_cost(window, self.costs)
        return self._costs[window]

    def gain(self, p: float, length: int) -> float:
        """Expected tokens per unit cost of a pass with `length` guesses, each right with chance p."""
        return sum(p**i for i in range(length + 1)) / self.cost(length + 1)

    def best_length(self, p: float, available: int) -> tuple[int, float]:
        """The number of guesses (0..available) with the best gain, and that gain (greedy: 1.0)."""
        best, best_gain = 0, 1.0
        expected, term = 1.0, 1.0
        for length in range(1, available + 1):
            term *= p
            expected += term
            g = expected / self.cost(length + 1)
            if g > best_gain:
                best, best_gain = length, g
        return (best, best_gain) if best_gain > 1.0 + self.margin else (0, 1.0)

    def suggest_length(self, source: str, match_len: int, available: int) -> int:
        """How many of `available` guesses from this source to send (0: a plain greedy pass is better)."""
        return self.best_length(self.rate(source, match_len).p, available)[0]

    def choose(self, candidates: Sequence[Candidate], k: int) -> tuple[Candidate | None, int]:
        """The candidate and length with the best expected tokens per cost; (None, 0) when none beats greedy."""
        best: tuple[Candidate | None, int] = (None, 0)
        best_gain = 1.0
        for c in candidates:
            length, g = self.best_length(self.rate(c.source, c.match_len).p, min(k, len(c.tokens)))
            if length and g > best_gain:
                best, best_gain = (c, length), g
        return best


# ---------------------------------------------------------------------------------------------
# Multi-branch verification


@dataclass
class Verdict:
    """The result of verifying a tree: what to commit and which window rows' KV to keep."""

    path: list[int]  # accepted guess nodes, root excluded, root to leaf
    committed: list[int]  # the target's predictions along root + path: exactly what greedy decoding emits
    keep: list[int]  # window rows whose KV to keep, in order: [0, *path]

    @property
    def contiguous(self) -> bool:
        """True when `keep` is 0..n-1: a plain commit(n) suffices, no KV gather."""
        return self.keep == list(range(len(self.keep)))


@dataclass
class Tree:
    """Candidate continuations flattened into one window: a trie whose shared prefixes appear once.

    Node 0 is the root (the last committed token). Nodes are in depth-first order following the
    candidates' order, so the first candidate occupies rows 1..len and a single candidate gives the
    plain Jacobi window with a lower-triangular mask.
    """

    tokens: list[int]
    parents: list[int]  # parent node of each node; -1 for the root
    positions: list[int]  # depth of each node (root 0): add the committed length for position_ids
    window_mask: np.ndarray  # bool [W, W]: row i may attend to column j iff j is i or an ancestor of i

    def accept(self, predictions: Sequence[int]) -> Verdict:
        return accept_branch(self.tokens, self.parents, predictions)


def build_tree(root: int, candidates: Sequence[Sequence[int]], max_nodes: int | None = None) -> Tree:
    """Merge candidates into a trie under `root`; stop adding nodes at `max_nodes` (root counted).

    Duplicates and candidates that are prefixes of others add no nodes.
    """
    children: list[dict[int, int]] = [{}]
    tokens, parents, depth = [int(root)], [-1], [0]
    for candidate in candidates:
        node = 0
        for token in candidate:
            token = int(token)
            child = children[node].get(token)
            if child is None:
                if max_nodes is not None and len(tokens) >= max_nodes:
                    break
                child = len(tokens)
                children[node][token] = child
                children.append({})
                tokens.append(token)
                parents.append(node)
                depth.append(depth[node] + 1)
            node = child
    _depth_first(tokens, parents, children, depth)
    return Tree(tokens, parents, depth, ancestor_mask(parents))


def _depth_first(tokens: list[int], parents: list[int], children: list[dict[int, int]], depth: list[int]) -> None:
    # Insertion order is breadth-mixed when a later candidate branches off early; renumber depth
    # first (children in insertion order) so the first candidate's path stays a window prefix.
    order: list[int] = []
    stack = [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(list(children[node].values())))
    new = {old: i for i, old in enumerate(order)}
    tokens[:] = [tokens[old] for old in order]
    depth[:] = [depth[old] for old in order]
    parents[:] = [-1 if parents[old] < 0 else new[parents[old]] for old in order]


def ancestor_mask(parents: Sequence[int]) -> np.ndarray:
    """Bool [W, W]: each node attends to itself and its ancestors (parents precede children)."""
    mask = np.zeros((len(parents), len(parents)), dtype=bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] = mask[parent]
        mask[node, node] = True
    return mask


def leaf_paths(parents: Sequence[int]) -> list[list[int]]:
    """Every root-to-leaf path of a tree, as node lists starting at the root (0)."""
    is_parent = set(parents)
    paths = []
    for leaf in range(len(parents)):
        if leaf in is_parent:
            continue
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def accept_branch(tokens: Sequence[int], parents: Sequence[int], predictions: Sequence[int]) -> Verdict:
    """Walk from the root, each step to the child whose token the target predicted at the current node.

    predictions[i] is the target's next token after node i given node i's ancestors, so every
    committed token is the target's greedy choice: the result equals greedy decoding exactly.
    """
    children: dict[tuple[int, int], int] = {}
    for node in range(len(tokens) - 1, 0, -1):  # first occurrence wins if a caller built duplicate siblings
        children[(parents[node], int(tokens[node]))] = node
    node, path = 0, []
    committed = [int(predictions[0])]
    while (child := children.get((node, committed[-1]))) is not None:
        node = child
        path.append(node)
        committed.append(int(predictions[node]))
    return Verdict(path, committed, [0, *path])


# ---------------------------------------------------------------------------------------------
# A proposer for the decoding loop


class NgramProposer(Proposer):
    """Prompt lookup + lookahead pool + the last Jacobi trajectory, sending only what pays.

    Each `propose(k)` looks up candidates from every source and returns the one (cut to the
    length) with the best expected tokens per pass cost, or no guesses when nothing beats greedy.
    `update` feeds the committed tokens and the pass's trajectory to the sources and scores every
    candidate of that pass against what was committed.
    """

    def __init__(
        self,
        lookup: PromptLookup | None = None,
        pool: NgramPool | None = None,
        tracker: AcceptanceTracker | None = None,
        use_jacobi: bool = True,
    ) -> None:
        self.lookup = lookup or PromptLookup()
        self.pool = pool or NgramPool()
        self.tracker = tracker or AcceptanceTracker()
        self.use_jacobi = use_jacobi
        self.trajectory: list[int] = []
        self.pending: list[Candidate] = []  # the last propose's candidates, scored in update

    def start(self, prompt: list[int], first: int) -> None:
        self.lookup.reset()
        self.pool.reset()
        self.lookup.extend([*prompt, first])
        self.pool.extend([*prompt, first])
        self.trajectory, self.pending = [], []

    def candidates(self, k: int, limit: int = 2) -> list[Candidate]:
        """Every source's candidates for the next k tokens."""
        if k <= 0:
            return []
        tail = self.lookup.tokens[-self.lookup.n_max :]
        found = self.lookup.lookup(tail, k, limit) + self.pool.lookup(tail[-2:], k, limit)
        if self.use_jacobi and self.trajectory:
            found.append(Candidate(self.trajectory[:k], "jacobi", 0))
        return found

    def propose(self, k: int) -> list[int]:
        self.pending = self.candidates(k)
        best, length = self.tracker.choose(self.pending, k)
        return best.tokens[:length] if best else []

    def propose_branches(self, k: int, limit: int = 4) -> list[list[int]]:
        """Candidates for a multi-branch pass (feed them to build_tree), each cut to its suggested
        length, best first; empty when none is worth sending."""
        self.pending = self.candidates(k, limit)
        ranked = []
        for c in self.pending:
            length, gain = self.tracker.best_length(self.tracker.rate(c.source, c.match_len).p, min(k, len(c.tokens)))
            if length:
                ranked.append((gain, c.tokens[:length]))
        ranked.sort(key=lambda item: -item[0])
        return [tokens for _, tokens in ranked]

    def update(self, guesses: list[int], predictions: list[int], n: int) -> None:
        committed = list(predictions[:n])
        self._score(committed)
        self.pool.observe(self.lookup.tokens[-2:], guesses, predictions)
        self._commit(committed)
        self.trajectory = list(predictions[n:])

    def update_tree(self, tree: Tree, predictions: Sequence[int], verdict: Verdict) -> None:
        """`update` for a multi-branch pass: every root-to-leaf branch's predictions feed the pool."""
        self._score(verdict.committed)
        context = self.lookup.tokens[-2:]
        for branch in leaf_paths(tree.parents):
            self.pool.observe(context, [tree.tokens[i] for i in branch[1:]], [int(predictions[i]) for i in branch])
        self._commit(verdict.committed)
        self.trajectory = []  # no single trajectory runs past the accepted point of a tree

    def _score(self, committed: list[int]) -> None:
        for candidate in self.pending:
            self.tracker.score(candidate, committed)
        self.pending = []

    def _commit(self, committed: list[int]) -> None:
        self.lookup.extend(committed)
        self.pool.extend(committed)
