"""OrtInplaceContext: the in-place window graph on onnxruntime's CPU provider.

KV layout. One array [layers*2, B, H, capacity, D] allocated once per context; each layer's key
and value block is bound as both the past input and the present output (IO binding, once per
context), so GroupQueryAttention writes the window's entries in place at each row's length and
nothing copies the cache:

    row b:  [ committed: lengths[b] | window: W entries written by the pass | unused ... capacity ]
    commit(n)          lengths += n            (the rest of the window is left behind, overwritten later)
    commit_rows(rows)  the accepted side branch's rows move to lengths[b]..: at most W rows per layer
    trim(length)       lengths = length

Each row of a batch has its own length (`lengths`); the graph's `cache_lengths` input is bound to
that array, so a commit is just an integer update. Per pass only ids, positions, the window mask,
the attention mask (a prefix of a ones buffer) and the greedy ids (plus logits when asked) are
bound again.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import BackendError
from ..spec import kv_inputs, kv_outputs
from .base import BackendContext, StepOutput

DTYPES = {"float32": np.float32, "float16": np.float16}


class OrtInplaceContext(BackendContext):
    def __init__(self, backend, capacity: int, batch: int):
        from .onnxrt import _binders

        arch = backend.manifest.architecture
        self.backend = backend
        self.batch, self.capacity = batch, capacity
        self.lengths = np.zeros(batch, dtype=np.int64)  # bound as `cache_lengths`: updated in place
        self.pending = 0
        self.session_seconds = 0.0
        self.vocab = arch.vocab_size
        dtype = DTYPES[backend.manifest.dtype]
        # np.empty leaves pages untouched until the cache grows into them: capacity costs address space, not RAM
        self._kv = np.empty((2 * arch.num_layers, batch, arch.kv_heads, capacity, arch.head_dim), dtype=dtype)
        self._ones = np.ones(batch * capacity, dtype=np.int64)  # any prefix is an all-ones [B, T] mask
        self._tril = np.tril(np.ones((min(capacity, 512),) * 2, dtype=bool))
        self._greedy = np.empty(batch * capacity, dtype=np.int64)
        self._logits_bound = False
        self.binding = backend.session.io_binding()
        self._bind_in, self._bind_out = _binders(self.binding, "cpu")
        self._bind_fixed()

    def _bind_fixed(self) -> None:
        """The cache (past and present: the same memory) and the lengths, bound once for the context."""
        layers = self._kv.shape[0] // 2
        shape = list(self._kv.shape[1:])
        dtype = self._kv.dtype
        for i, (past, present) in enumerate(zip(kv_inputs(layers), kv_outputs(layers))):
            pointer = self._kv[i].ctypes.data
            self._bind_in(past.name, dtype, shape, pointer)
            self._bind_out(present.name, dtype, shape, pointer)
        self._bind_in("cache_lengths", self.lengths.dtype, [self.batch], self.lengths.ctypes.data)

    @property
    def length(self) -> int:
        """The committed entries of a batch whose rows are equally long (see `lengths` otherwise)."""
        if self.batch > 1 and (self.lengths != self.lengths[0]).any():
            raise BackendError(f"the rows have different lengths {self.lengths.tolist()}; read `lengths`")
        return int(self.lengths[0])

    def forward(self, ids, positions=None, window_mask=None, want_logits=False) -> StepOutput:
        if self._kv is None:
            raise BackendError("this context was closed; open a new one with backend.context(capacity)")
        batch, window = self._check_inplace_window(ids)
        total = int(self.lengths.max()) + window
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if positions is None:
            positions = self.lengths[:, None] + np.arange(window, dtype=np.int64)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        if window_mask is None:
            window_mask = self._lower_triangular(window)
        window_mask = np.ascontiguousarray(np.broadcast_to(window_mask, (batch, window, window)), dtype=bool)
        greedy = self._greedy[: batch * window].reshape(batch, window)

        bind = self._bind_in
        bind("input_ids", ids.dtype, [batch, window], ids.ctypes.data)
        bind("position_ids", positions.dtype, [batch, window], positions.ctypes.data)
        bind("window_mask", window_mask.dtype, [batch, window, window], window_mask.ctypes.data)
        bind("attention_mask", self._ones.dtype, [batch, total], self._ones.ctypes.data)
        logits = self._bind_outputs(greedy, want_logits)
        started = time.perf_counter()
        try:
            self.backend.session.run_with_iobinding(self.binding)
        except Exception as exc:  # onnxruntime's own exception types
            raise BackendError(
                f"onnxruntime failed on a window of {window} after {self.lengths.tolist()} cached entries ({type(exc).__name__}: {exc})"
            ) from exc
        finally:
            self.session_seconds += time.perf_counter() - started
        self.pending = window
        return StepOutput(greedy.copy(), logits)

    def _bind_outputs(self, greedy: np.ndarray, want_logits: bool) -> np.ndarray | None:
        if self._logits_bound and not want_logits:  # an output cannot be unbound alone: rebind the rest
            self.binding.clear_binding_outputs()
            layers = self._kv.shape[0] // 2
            for i, present in enumerate(kv_outputs(layers)):
                self._bind_out(present.name, self._kv.dtype, list(self._kv.shape[1:]), self._kv[i].ctypes.data)
            self._logits_bound = False
        self._bind_out("greedy_ids", greedy.dtype, list(greedy.shape), greedy.ctypes.data)
        if not want_logits:
            return None
        logits = np.empty((*greedy.shape, self.vocab), dtype=np.float32)
        self._bind_out("logits", logits.dtype, list(logits.shape), logits.ctypes.data)
        self._logits_bound = True
        return logits

    def _check_inplace_window(self, ids: np.ndarray) -> tuple[int, int]:
        if self.pending:
            raise BackendError("forward() called twice without commit(n) in between; commit the last window first")
        if ids.ndim != 2 or ids.shape[0] != self.batch or ids.shape[1] < 1:
            raise BackendError(f"window ids must have shape [{self.batch}, W>=1], got {list(ids.shape)}")
        window = ids.shape[1]
        longest = int(self.lengths.max())
        if longest + window > self.capacity:
            raise BackendError(
                f"window of {window} after {longest} cached entries exceeds the context's capacity "
                f"of {self.capacity}; open the context with a larger capacity"
            )
        return self.batch, window

    def _lower_triangular(self, window: int) -> np.ndarray:
        if window <= self._tril.shape[0]:
            return self._tril[:window, :window][None]
        return np.tril(np.ones((window, window), dtype=bool))[None]

    def commit(self, n) -> None:
        """Keep the first n entries of the last window: one n for every row, or one per row."""
        counts = np.broadcast_to(np.asarray(n, dtype=np.int64), (self.batch,))
        if (counts < 0).any() or (counts > self.pending).any():
            raise BackendError(f"commit({np.asarray(n).tolist()}) is outside the last window of {self.pending} entries")
        self.lengths += counts  # in place: the bound `cache_lengths` sees it
        self.pending = 0

    def commit_rows(self, rows: list[int], row: int | None = None) -> None:
        """Keep the last window's entries `rows` (ascending, distinct) of batch row `row` (every row when None)."""
        window = self.pending
        if any(not 0 <= r < window for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
            raise BackendError(f"commit_rows({list(rows)}) needs ascending, distinct rows of the last window of {window}")
        targets = range(self.batch) if row is None else [row]
        keep = np.asarray(rows, dtype=np.int64)
        if list(rows) != list(range(len(rows))):
            for b in targets:
                start = int(self.lengths[b])
                # [layers*2, H, k, D]: the fancy index reads a copy, so moving down in place is safe
                block = self._kv[:, b]  # a view [layers*2, H, capacity, D]
                block[:, :, start : start + len(rows)] = block[:, :, start + keep]
        for b in targets:
            self.lengths[b] += len(rows)
        self.pending = 0

    def trim(self, length) -> None:
        """Rewind to `length` entries: one length for every row, or one per row."""
        if self.pending:
            raise BackendError("trim() while a window is pending; commit(n) it first")
        wanted = np.broadcast_to(np.asarray(length, dtype=np.int64), (self.batch,))
        if (wanted < 0).any() or (wanted > self.lengths).any():
            raise BackendError(f"trim({np.asarray(length).tolist()}) is outside the committed cache of {self.lengths.tolist()} entries")
        self.lengths[:] = wanted

    def kv(self, layer: int, kind: str = "key", row: int = 0) -> np.ndarray:
        """The committed cache of one layer and batch row, [1, H, length, D] (a view, for tests and tools)."""
        block = self._kv[2 * layer + (kind == "value"), row : row + 1]
        return block[:, :, : int(self.lengths[row])]

    def close(self) -> None:
        self._kv = None
