"""OrtInplaceContext: the in-place window graph on onnxruntime's CPU provider.

KV layout. One array [layers*2, B, H, capacity, D] allocated once per context; each layer's key
and value block is bound as both the past input and the present output (IO binding, once per
context), so the graph (ScatterND, or GroupQueryAttention) writes the window's entries in place at
each row's length and nothing copies the cache:

    row b:  [ committed: lengths[b] | window: W entries written by the pass | unused ... capacity ]
    commit(n)          lengths += n            (the rest of the window is left behind, overwritten later)
    commit_rows(rows)  the accepted side branch's rows move to lengths[b]..: at most W rows per layer
    trim(length)       lengths = length

Each row of a batch has its own length (`lengths`); the graph's `cache_lengths` input is bound to
that array, so a commit is just an integer update. `select(start, stop)` runs the next passes on a
contiguous range of rows only (per layer, kv[i, start:stop] is one contiguous block): the batch
batcher (runtime/batcher.py) runs only its active slots; `commit_each` keeps each row's own entries,
`move_row` packs a row into a lower slot. Per pass only ids, positions, the window mask,
the attention mask (a prefix of a ones buffer) and the greedy ids (plus logits when asked) are
bound again.
"""

from __future__ import annotations

import mmap

import numpy as np

from ..errors import BackendError
from ..spec import kv_inputs, kv_outputs
from .base import check_kept
from .ort_binding import OrtBinding

HUGE_PAGES_UP_TO = 64 << 20  # bytes: a cache this small may sit on huge pages whole


def zeroed_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed cache array: on transparent huge pages when small, else on small pages mapped as written.

    np.zeros asks the kernel for transparent huge pages (numpy madvises large arrays): a row's
    [capacity, head_dim] block of one head is 2 MB at capacity 8192, so writing one token there
    faulted in, and zeroed, a whole 2 MB page: 5.8 GB resident for 16 rows of 16 tokens
    (measured), and seconds per prefill. Anonymous memory without huge pages grows 4 KB at a time.
    But huge pages make each pass's cache reads cheaper: SmolLM2 fp32 greedy, a context sized to
    the request (14 MB), 2-4% less time in onnxruntime per pass (17.75 vs 18.11 and 19.17 vs 19.89 ms,
    8 chat prompts, interleaved, 2026-12-01). So a cache of at most HUGE_PAGES_UP_TO, which huge
    pages can at worst make resident whole, keeps them.
    """
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not hasattr(mmap, "MADV_NOHUGEPAGE") or nbytes <= HUGE_PAGES_UP_TO:
        return np.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, dtype=dtype).reshape(shape)  # the array keeps the mapping alive


class OrtInplaceContext(OrtBinding):
    def __init__(self, backend, capacity: int, batch: int):
        super().__init__(backend, capacity, batch, "cpu")
        arch = backend.manifest.architecture
        self._row_lengths = np.zeros(batch, dtype=np.int64)  # bound as `cache_lengths`: updated in place
        # Zeroed, not np.empty: the graph may read the whole capacity (masked), and garbage could be NaN.
        # Spare entries for what a pass writes past its window: the extra attention row, a pad row.
        shape = (2 * arch.num_layers, batch, arch.kv_heads, capacity + backend.spare_entries, arch.head_dim)
        self._kv = zeroed_pages(shape, np.dtype(backend.manifest.dtype))
        self._rows = (0, batch)  # the rows the next pass runs on (select)
        self._bind_fixed()

    def _bind_fixed(self) -> None:
        """The cache (past and present: the same memory) and the lengths of the selected rows, bound
        once for the context and again by select()."""
        layers = self._kv.shape[0] // 2
        start, stop = self._rows
        shape = [stop - start, *self._kv.shape[2:]]
        dtype = self._kv.dtype
        for i, (past, present) in enumerate(zip(kv_inputs(layers), kv_outputs(layers))):
            pointer = self._kv[i, start:stop].ctypes.data
            self._bind_in(past.name, dtype, shape, pointer)
            self._bind_out(present.name, dtype, shape, pointer)
        self._selected = self.lengths[start:stop]  # a view: updating it updates the bound `cache_lengths`
        self._bind_in("cache_lengths", self.lengths.dtype, [stop - start], self._selected.ctypes.data)

    def select(self, start: int, stop: int) -> None:
        """Run the next passes on rows [start, stop) only; forward() then takes ids [stop - start, W]."""
        self._check_idle("select")
        if not 0 <= start < stop <= self.batch:
            raise BackendError(f"select({start}, {stop}) is outside the context's {self.batch} rows")
        if (start, stop) != self._rows:
            self._rows = (start, stop)
            self._bind_fixed()

    @property
    def lengths(self) -> np.ndarray:
        """Each row's committed entries: the array bound as `cache_lengths` (update it in place)."""
        return self._row_lengths

    @property
    def length(self) -> int:
        """The committed entries of a batch whose rows are equally long (see `lengths` otherwise)."""
        if self.batch > 1 and (self.lengths != self.lengths[0]).any():
            raise BackendError(f"the rows have different lengths {self.lengths.tolist()}; read `lengths`")
        return int(self.lengths[0])

    def _starts(self) -> tuple[np.ndarray, int, int]:
        lengths = self._selected
        return lengths[:, None], len(lengths), int(lengths[0] if len(lengths) == 1 else lengths.max())

    def commit(self, n: int) -> None:
        """Keep the first n entries of the last window in every selected row (commit_each: each row its own)."""
        if not 0 <= n <= self.pending:
            raise BackendError(f"commit({n}) is outside the last window of {self.pending} entries")
        self._selected += n  # in place: the bound `cache_lengths` sees it
        self.pending = 0

    def commit_each(self, keeps: list[list[int]]) -> None:
        """Keep, for each selected row, its own window entries (ascending, distinct; [] keeps none)."""
        start, stop = self._rows
        if len(keeps) != stop - start:
            raise BackendError(
                f"commit_each() needs one list of entries per selected row ({stop - start}), got {len(keeps)}"
            )
        for b, rows in zip(range(start, stop), keeps):
            rows = list(rows)
            if not check_kept(rows, self.pending, f"commit_each(): row {b}"):  # a side branch, gathered into place
                at, block = int(self._row_lengths[b]), self._kv[:, b]  # a view [layers*2, H, capacity, D]
                block[:, :, at : at + len(rows)] = block[:, :, at + np.asarray(rows)]  # the index reads a copy first
            self._row_lengths[b] += len(rows)
        self.pending = 0

    def move_row(self, source: int, target: int) -> None:
        """Copy row `source`'s committed cache and length into row `target` (a free slot); `source` is emptied."""
        self._check_idle("move_row")
        n = int(self.lengths[source])
        self._kv[:, target, :, :n] = self._kv[:, source, :, :n]
        self.lengths[target], self.lengths[source] = n, 0

    def commit_rows(self, rows: list[int], row: int | None = None) -> None:
        """Keep the last window's entries `rows` (ascending, distinct) of batch row `row` (every row when None)."""
        self.commit_each([list(rows) if row in (None, b) else [] for b in range(*self._rows)])

    def trim(self, length: int) -> None:
        """Rewind every selected row to `length` entries (trim_row: one row)."""
        self._check_idle("trim")
        if not 0 <= length <= self._selected.min():
            raise BackendError(f"trim({length}) is outside the committed cache of {self._selected.tolist()} entries")
        self._selected[:] = length

    def load_prefix(self, source, length: int, row: int = 0, source_row: int = 0) -> bool:
        """Copy the first `length` entries of `source`'s row `source_row` into this context's row `row`."""
        if not isinstance(source, OrtInplaceContext) or self.pending or length > self.capacity:
            return False
        self._kv[:, row, :, :length] = source._kv[:, source_row, :, :length]
        self.lengths[row] = length
        return True

    def swap_rows(self, a: int, b: int) -> None:
        """Rows a and b trade their committed caches and lengths (a kept prefix moves where the rows are packed)."""
        self._check_idle("swap_rows")
        if a == b:
            return
        la, lb = int(self.lengths[a]), int(self.lengths[b])
        saved = self._kv[:, a, :, :la].copy()
        self._kv[:, a, :, :lb] = self._kv[:, b, :, :lb]
        self._kv[:, b, :, :la] = saved
        self.lengths[a], self.lengths[b] = lb, la

    def trim_row(self, row: int, length: int) -> None:
        self._check_idle("trim_row")
        if not 0 <= length <= self.lengths[row]:
            raise BackendError(f"trim_row({row}, {length}) is outside the row's {int(self.lengths[row])} entries")
        self.lengths[row] = length

    def kv(self, layer: int, kind: str = "key", row: int = 0) -> np.ndarray:
        """The committed cache of one layer and batch row, [1, H, length, D] (a view, for tests and tools)."""
        block = self._kv[2 * layer + (kind == "value"), row : row + 1]
        return block[:, :, : int(self.lengths[row])]

    def close(self) -> None:
        self._kv = None
