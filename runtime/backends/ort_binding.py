"""OrtBinding: what the onnxruntime contexts share (portable and in-place): one IO binding and forward()."""

from __future__ import annotations

import numpy as np

from ..errors import BackendError
from .base import BackendContext, StepOutput, window_inputs
from .exact_rows import needs_pad, pad


def _binders(binding, device: str):
    """(bind_input, bind_output)(name, dtype, shape, pointer) for tensors on `device`.

    The public IOBinding methods rebuild the device descriptor on every call (~20 us per tensor,
    120 tensors a pass for a 30-layer model); onnxruntime's C binding with the descriptor made
    once skips that. Falls back to the public methods if those internals change.
    """
    try:
        from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

        raw = binding._iobinding
        c_device = OrtDevice.make(device, 0)._get_c_device()
        return (
            lambda n, t, s, p: raw.bind_input(n, c_device, t, s, p),
            lambda n, t, s, p: raw.bind_output(n, c_device, t, s, p),
        )
    except (ImportError, AttributeError, TypeError):
        return (
            lambda n, t, s, p: binding.bind_input(n, device, 0, t, s, p),
            lambda n, t, s, p: binding.bind_output(n, device, 0, t, s, p),
        )


class OrtBinding(BackendContext):
    """What the onnxruntime contexts share: one IO binding, host buffers of all-ones attention mask and of greedy
    ids (a prefix of either is a valid [B, T] array), and forward(), which binds the window and runs the graph.
    The portable contexts bind their cache every pass (`_bind_cache`), the in-place one once (`_bind_fixed`)."""

    def __init__(self, backend, capacity: int, batch: int, device: str):
        self.backend, self.batch, self.capacity, self.pending = backend, batch, capacity, 0
        self.vocab = backend.manifest.architecture.vocab_size
        entries = batch * (capacity + backend.spare_entries)
        self._ones = np.ones(entries, dtype=np.int64)
        self._greedy = np.empty(entries, dtype=np.int64)
        self._logits_bound = False
        self.binding = backend.session.io_binding()
        self._bind_in, self._bind_out = _binders(self.binding, device)  # the cache, on `device`
        # Small inputs and outputs live in host memory; on CUDA onnxruntime copies them (a few hundred bytes).
        self._host_in, self._host_out = _binders(self.binding, "cpu")

    def _starts(self) -> tuple[int | np.ndarray, int, int]:
        """(each row's length: an int, or [rows, 1]; the rows of the next pass; the longest row's length)."""
        return self.length, self.batch, self.length

    def forward(self, ids, positions=None, window_mask=None, want_logits=False) -> StepOutput:
        self._check_open()
        past, rows, longest = self._starts()
        _, window = self._check_window(ids, rows, longest)
        ids, positions, window_mask = window_inputs(ids, positions, window_mask, past)
        self.padding = int(self.backend.pad_rows and needs_pad(rows, window, self.backend.extra_row))
        if self.padding:  # a pad column, so that no kernel runs one row (exact_rows.py)
            ids, positions, window_mask = pad(ids, positions, window_mask)
        width, total = window + self.padding, longest + window + self.padding
        bind = self._host_in
        bind("input_ids", ids.dtype, [rows, width], ids.ctypes.data)
        bind("position_ids", positions.dtype, [rows, width], positions.ctypes.data)
        bind("window_mask", window_mask.dtype, [rows, width, width], window_mask.ctypes.data)
        bind("attention_mask", self._ones.dtype, [rows, total], self._ones.ctypes.data)
        greedy = self._greedy[: rows * width].reshape(rows, width)
        logits = self._bind_outputs(greedy, want_logits)
        self._bind_cache(longest, total)
        try:
            self.backend.session.run_with_iobinding(self.binding)
        except Exception as exc:  # onnxruntime's own exception types
            raise BackendError(
                f"onnxruntime failed on a window of {window} after {self.lengths.tolist()} cached entries "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        self.pending = window
        return StepOutput(greedy[:, :window].copy(), None if logits is None else logits[:, :window])

    def _bind_outputs(self, greedy: np.ndarray, want_logits: bool) -> np.ndarray | None:
        if self._logits_bound and not want_logits:  # an output cannot be unbound alone: rebind the rest
            self.binding.clear_binding_outputs()
            self._bind_fixed()
            self._logits_bound = False
        self._host_out("greedy_ids", greedy.dtype, list(greedy.shape), greedy.ctypes.data)
        if not want_logits:
            return None
        logits = np.empty((*greedy.shape, self.vocab), dtype=np.float32)
        self._host_out("logits", logits.dtype, list(logits.shape), logits.ctypes.data)
        self._logits_bound = True
        return logits

    def _bind_fixed(self) -> None:
        """Bind what stays bound from pass to pass (the in-place cache)."""

    def _bind_cache(self, past: int, total: int) -> None:
        """Bind the cache for a pass after `past` entries that writes `total` (the portable graph's)."""
