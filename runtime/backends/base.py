"""The backend interface: a shared, thread-safe model plus one KV-owning context per generation.

A `Backend` holds what is loaded once (an onnxruntime session, a TensorRT engine). A
`BackendContext` is one sequence's state on the device: KV buffers allocated once at `capacity`
entries, and the bindings. A sequence of one row drives a context with four calls:

    out = ctx.forward(window_ids)   # one pass over `length` cached entries + the window
    ctx.commit(n)                   # keep the KV of the window's first n entries, drop the rest
    ctx.commit_rows([0, 2, 5])      # or keep these window entries (an accepted branch of a tree window)
    ctx.trim(length)                # rewind to `length` entries (e.g. a draft model after a rejection)

and the batcher (runtime/batcher.py) drives every context through the row contract: `lengths` (each
row's committed entries), `select(start, stop)` (the rows of the next pass), `commit_each(keeps)`
(each row keeps its own entries), `move_row`, `swap_rows` and `trim_row`. A context of one row (the portable
graph, TensorRT) gets it here; the in-place graph's context holds rows of their own lengths
(`Backend.batched`), so many generations share its passes.

Only ids, positions and masks go to the device; only greedy ids (and logits when asked) come back.
`Backend.limits` says what one context can take (a TensorRT engine's optimization profiles may
allow less than the manifest's max_context); the Generator keeps every pass within them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Self

import numpy as np

from ..errors import BackendError
from ..manifest import Manifest
from .exact_rows import UNCHECKED, RowsCheck

PREFILL_CHUNK = 256  # prompt tokens per prefill pass, unless a backend's limits allow fewer
_TRIL = np.tril(np.ones((512, 512), dtype=bool))  # windows and prefill chunks: read, never written


def lower_triangular(n: int) -> np.ndarray:
    """The causal mask of an n-token window, [n, n]."""
    return _TRIL[:n, :n] if n <= 512 else np.tril(np.ones((n, n), dtype=bool))


def padded(rows: list[tuple[list[int], np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (tokens, positions, mask) as one pass's [B, W] ids and positions and [B, W, W] mask, padded to the
    widest: padding repeats the row's last token and position and attends to itself only (never committed)."""
    if len(rows) == 1:
        tokens, positions, mask = rows[0]
        return np.array([tokens], dtype=np.int64), positions[None], mask[None]
    k, width = len(rows), max(len(tokens) for tokens, _, _ in rows)
    ids = np.empty((k, width), dtype=np.int64)
    out_positions = np.empty((k, width), dtype=np.int64)
    out_mask = np.zeros((k, width, width), dtype=bool)
    out_mask[:, np.arange(width), np.arange(width)] = True
    for i, (tokens, positions, mask) in enumerate(rows):
        n = len(tokens)
        ids[i, :n], ids[i, n:] = tokens, tokens[-1]
        out_positions[i, :n], out_positions[i, n:] = positions, positions[-1]
        out_mask[i, :n, :n] = mask
    return ids, out_positions, out_mask


def window_inputs(ids, positions, window_mask, past) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pass's ids and positions [B, W] int64 and window mask [B, W, W] bool, C-contiguous for a binding:
    positions default to `past` (an int, or each row's length [B, 1]) + 0..W-1, the mask to lower-triangular."""
    rows, window = ids.shape
    if positions is None:
        positions = past + np.arange(window, dtype=np.int64)
    if window_mask is None:
        window_mask = lower_triangular(window)
    return (
        np.ascontiguousarray(ids, dtype=np.int64),
        np.ascontiguousarray(np.broadcast_to(positions, (rows, window)), dtype=np.int64),
        np.ascontiguousarray(np.broadcast_to(window_mask, (rows, window, window)), dtype=bool),
    )


def check_kept(rows: list[int], window: int, what: str) -> bool:
    """Whether the kept window entries `rows` are a prefix of the window; a BackendError naming `what` unless
    they are ascending, distinct entries of the last window of `window`."""
    if rows == list(range(len(rows))):
        if len(rows) <= window:
            return True
    elif all(0 <= r < window for r in rows) and all(a < b for a, b in zip(rows, rows[1:])):
        return False
    raise BackendError(f"{what} keeps {rows}: not ascending, distinct entries of the last window of {window}")


@dataclass(frozen=True)
class BackendLimits:
    """What every pass of one sequence may use on a backend."""

    max_context: int  # KV entries of one sequence: prompt + output
    prefill_chunk: int  # prompt tokens per prefill pass
    max_window: int  # tokens in one decoding pass (the last token + guesses)
    # Whether a window may hold several branches. A side branch's row attends to its ancestors across
    # masked columns (the other branches); the gap moves its entries to other SIMD lanes of the softmax
    # and attention sums, so its logits round differently from a one-token pass. Float activations
    # absorb that last bit; int8 activations (accuracy level 4) can turn it into a whole quantization
    # step and flip a greedy id. A single chain has no gap: its rows are bitwise those of one-token passes.
    branches: bool = True


@dataclass
class StepOutput:
    greedy_ids: np.ndarray  # [B, W] int64, argmax of the logits, computed in-graph
    logits: np.ndarray | None = None  # [B, W, vocab] float32, only when forward(want_logits=True)


class Closable:
    """close() releases what it holds (at the end of a `with` block too); it is unusable afterwards."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BackendContext(Closable, ABC):
    """One sequence (or batch of sequences) and its KV cache. Not thread-safe: one per generation."""

    batch: int
    capacity: int  # KV entries the buffers hold
    length: int  # committed KV entries
    pending: int  # window entries of the last forward, not yet committed
    padding: int = 0  # entries the last forward wrote past its window (a pad row: exact_rows.py), never committed

    @abstractmethod
    def forward(
        self,
        ids: np.ndarray,
        positions: np.ndarray | None = None,
        window_mask: np.ndarray | None = None,
        want_logits: bool = False,
    ) -> StepOutput:
        """Run the window ids [B, W] after the committed entries.

        positions default to length + arange(W); window_mask [B, W, W] to lower-triangular.
        Must be followed by commit(n) before the next forward.
        """

    def commit(self, n: int) -> None:
        """Keep the KV of the last window's first n entries (0 <= n <= W); the rest are dropped."""
        if not 0 <= n <= self.pending:
            raise BackendError(f"commit({n}) is outside the last window of {self.pending} entries")
        old, self.pending = self.length + self.pending + self.padding, 0
        self._compact(old, self.length + n)

    def commit_rows(self, rows: list[int]) -> None:
        """Keep the KV of the last window's entries `rows` (ascending, distinct), in that order.

        For verified branches (a tree window), whose accepted path is not a prefix of the window.
        """
        rows = list(rows)
        if check_kept(rows, self.pending, "commit_rows()"):
            return self.commit(len(rows))
        old, self.pending = self.length + self.pending + self.padding, 0
        self._gather(old, rows)

    def trim(self, length: int) -> None:
        """Rewind the committed cache to its first `length` entries."""
        self._check_idle("trim")
        if not 0 <= length <= self.length:
            raise BackendError(f"trim({length}) is outside the committed cache of {self.length} entries")
        self._compact(self.length, length)

    def _compact(self, old: int, new: int) -> None:
        """Keep the first `new` of the `old` cache entries the current buffers hold (commit and trim)."""
        raise NotImplementedError(f"{type(self).__name__} keeps entries its own way")

    def _gather(self, old: int, rows: list[int]) -> None:
        """Of the `old` entries the current buffers hold, keep the committed ones and then window entries `rows`."""
        raise BackendError(f"{type(self).__name__} cannot gather window rows; verify a single branch and commit(n)")

    # -- the row contract (runtime/batcher.py): a context of one row; OrtInplaceContext holds many ------

    @property
    def lengths(self) -> np.ndarray:
        """Each row's committed entries (a copy here; rows of one context share one length)."""
        return np.full(self.batch, self.length, dtype=np.int64)

    def select(self, start: int, stop: int) -> None:
        """Run the next passes on rows [start, stop) only: every row here."""
        if (start, stop) != (0, self.batch):
            raise BackendError(
                f"{type(self).__name__} runs all its {self.batch} rows together, not rows {start}..{stop - 1}"
            )

    def commit_each(self, keeps: list[list[int]]) -> None:
        """Keep, for each selected row, its own window entries (ascending, distinct)."""
        if self.batch != 1 and any(list(k) != list(keeps[0]) for k in keeps):
            raise BackendError(f"{type(self).__name__}'s rows share one length: they keep the same entries")
        self.commit_rows(keeps[0])

    def move_row(self, source: int, target: int) -> None:
        """Copy row `source`'s cache and length into row `target` (a free slot)."""
        raise BackendError(f"{type(self).__name__}'s rows share one length: a row cannot move")

    def load_prefix(self, source: BackendContext, length: int, row: int = 0, source_row: int = 0) -> bool:
        """Copy the first `length` cache entries of `source`'s row `source_row` into row `row` of this context,
        if this kind of context can; returns whether it did."""
        return False

    def swap_rows(self, a: int, b: int) -> None:
        """Rows a and b trade their caches and lengths."""
        if a != b:
            raise BackendError(f"{type(self).__name__}'s rows share one length: rows cannot trade places")

    def trim_row(self, row: int, length: int) -> None:
        """Rewind row `row` to its first `length` entries."""
        if self.batch != 1:
            raise BackendError(f"{type(self).__name__}'s rows share one length: trim() them together")
        self.trim(length)

    def _check_idle(self, call: str) -> None:
        if self.pending:
            raise BackendError(f"{call}() while a window is pending; commit(n) it first")

    def _check_open(self) -> None:
        if getattr(self, "_kv", None) is None:
            raise BackendError("this context was closed; open a new one with backend.context(capacity)")

    def _check_window(self, ids: np.ndarray, rows: int | None = None, longest: int | None = None) -> tuple[int, int]:
        """(rows, window) of ids [rows, W] after `longest` cached entries (default: every row, `length`)."""
        rows, longest = self.batch if rows is None else rows, self.length if longest is None else longest
        if self.pending:
            raise BackendError("forward() called twice without commit(n) in between; commit the last window first")
        if ids.ndim != 2 or ids.shape[0] != rows or ids.shape[1] < 1:
            raise BackendError(f"window ids must have shape [{rows}, W>=1], got {list(ids.shape)}")
        window = ids.shape[1]
        if longest + window > self.capacity:
            raise BackendError(
                f"window of {window} after {longest} cached entries exceeds the context's capacity "
                f"of {self.capacity}; open the context with a larger capacity"
            )
        return rows, window


class Backend(Closable, ABC):
    """A loaded model: shared by threads; each generation opens its own context."""

    name: str
    manifest: Manifest
    rows: RowsCheck = RowsCheck(UNCHECKED)  # how this CPU keeps windows exact (exact_rows.py)
    pad_rows: bool = False  # whether passes that would leave a one-row MatMulNBits tile get a pad row
    spare_entries: int = 0  # cache entries past a context's capacity that a pass may write
    batched: bool = False  # contexts hold rows of their own lengths (a batcher's slots); else one row a context

    @property
    def limits(self) -> BackendLimits:
        """The manifest's context, in passes of any width; backends with tighter limits override this."""
        context = self.manifest.max_context
        return BackendLimits(context, min(PREFILL_CHUNK, context), context)

    @abstractmethod
    def context(self, capacity: int, batch: int = 1) -> BackendContext:
        """A new sequence state whose KV buffers hold `capacity` entries (capped at max_context)."""
