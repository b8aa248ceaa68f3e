"""OrtBackend: the window graph on onnxruntime (CPU or CUDA execution provider), with IO binding.

KV layout. Per layer and kind (key/value) the context owns two flat buffers of
B*H*capacity*D elements ("ping" and "pong"), allocated once. A pass binds the past inputs as
[B, H, P, D] views of the current buffer's first B*H*P*D elements and the present outputs as
[B, H, P+W, D] views of the other one, so the graph's concat writes the new cache straight into
our memory; then the two swap. When only n of the W window entries are kept, the per-head blocks
are moved down in place ([B, H, P+W, D] -> [B, H, P+n, D]): the only KV copy the runtime makes.
On the CUDA execution provider the cache is a DeviceKV instead (device_kv.py: the same two sides
in device memory, trimmed by device copies; OrtDeviceContext below).
"""

from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import BackendError, require
from ..manifest import Manifest
from ..spec import INPLACE, PORTABLE, input_names, kv_inputs, kv_outputs
from .base import Backend, BackendLimits, StepOutput
from .cuda import CudaMemory, device_count, load_cudart
from .device_kv import DeviceKV, DeviceKVContext, release
from .exact_rows import UNCHECKED, RowsCheck, check, cpuinfo
from .inplace import OrtInplaceContext
from .ort_binding import OrtBinding
from .ort_session import open_session, session_options

ORT_HINT = (
    "pip install onnxruntime (or onnxruntime-gpu for CUDA, never both); "
    'from the jacobi-rt checkout: pip install ".[cpu]" or ".[gpu]"'
)


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads do not help the matmuls)."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = {(block.get("physical id"), block["core id"]) for block in cpuinfo() if "core id" in block}
    return max(1, min(len(cores) or allowed, allowed))


class OrtBackend(Backend):
    """One InferenceSession per artifact; `context()` gives each generation its own KV buffers."""

    def __init__(
        self,
        folder: str | Path,
        manifest: Manifest,
        device: str = "auto",
        threads: int | None = None,
        graph: str = "auto",
        mapped: bool = False,
    ):
        """graph: "auto" (the in-place graph on the CPU when the artifact has one, else the portable
        graph), "portable" or "inplace". mapped: on the CPU, a mapped session (ort_session.py)."""
        ort = require("onnxruntime", ORT_HINT)
        self.manifest = manifest
        self.device = _pick_device(ort, device)
        self.graph = _pick_graph(manifest, graph, self.device)
        self.name = f"onnxruntime-{self.device}"
        self.threads = threads or physical_cores()
        folder = Path(folder)
        graph = folder / manifest.graphs[self.graph]
        options = session_options(ort, self.threads)
        # Threads spin within a run but not after it: a spinning target pool stole the cores from the
        # draft's pass that follows (2 cores: speculative 30.6 -> 57.6 tokens/s; greedy unchanged).
        options.add_session_config_entry("session.force_spinning_stop", "1")
        providers = (
            ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.device == "cuda" else ["CPUExecutionProvider"]
        )
        try:  # mapped: prepacked once for this CPU (ort_session.py), mapped at every load
            self.session, self.session_graph = open_session(
                ort, folder, manifest, self.graph, options, providers, mapped
            )
        except Exception as exc:  # onnxruntime raises its own exception types for bad graphs and EPs
            raise BackendError(
                f"onnxruntime could not load {graph} ({type(exc).__name__}: {exc}); re-export the artifact"
            ) from exc
        self.mapped = self.session_graph != graph  # the session maps a cached entry (ort_session.py)
        self._check_graph()
        self.batched = self.graph == INPLACE  # its contexts hold rows of their own lengths (the batcher's slots)
        self.pad_rows = False  # pad the passes that would run a one-row kernel (exact_rows.py)
        self.rows = self._check_rows()

    def _check_rows(self) -> RowsCheck:
        """How this CPU keeps a target's windows bitwise one-token passes (exact_rows.py); a draft's passes
        only guess."""
        if self.manifest.role == "draft":
            return RowsCheck(UNCHECKED)
        return check(self)

    @property
    def extra_row(self) -> bool:
        """Whether this graph's attention has the extra row (exporter/attention/gqa_rows.py): the in-place one's."""
        return self.graph == INPLACE and self.manifest.attention_extra_row

    @property
    def spare_entries(self) -> int:
        """Cache entries past the capacity that a pass may write: the extra attention row, a pad row."""
        return int(self.extra_row) + int(self.pad_rows)

    def _check_graph(self) -> None:
        layers = self.manifest.architecture.num_layers
        names = {i.name for i in self.session.get_inputs()}
        expected = set(input_names(layers, self.graph))
        if names != expected:
            raise BackendError(
                f"the {self.graph} graph's inputs do not match the window-graph contract for {layers} layers "
                f"(unexpected: {sorted(names - expected)[:4]}, missing: {sorted(expected - names)[:4]}); "
                "re-export the artifact"
            )

    @property
    def limits(self) -> BackendLimits:
        """The manifest's limits; windows stay one chain when the weights round activations to int8."""
        return replace(super().limits, branches=not int8_activations(self.manifest))

    def context(self, capacity: int, batch: int = 1) -> OrtContext:
        capacity = max(1, min(capacity, self.manifest.max_context))
        if self.graph == INPLACE:
            return OrtInplaceContext(self, capacity, batch)
        return (OrtDeviceContext if self.device == "cuda" else OrtContext)(self, capacity, batch)


def int8_activations(manifest: Manifest) -> bool:
    """Weights run through MatMulNBits at accuracy level 4, which rounds each activation block to int8.

    Rounding amplifies last-bit differences into different greedy ids. Two sources: GroupQueryAttention's
    one-token and many-token paths differ (SmolLM2 GGUF weights: `jacobi` equal to the in-place graph's
    own greedy on 2 of 12 bench prompts), and a side branch's masked gap changes the rounding of its
    attention sums on either graph (BackendLimits.branches). The portable graph's rows of one chain are
    bitwise those of one-token passes at every window, and so are the in-place graph's when its attention
    never takes the one-row path (`Manifest.attention_extra_row`). So `auto` runs such artifacts on the in-place
    graph only when it has the extra row (else on the portable one), and their windows one chain: exact first."""
    return manifest.accuracy_level == 4


def _pick_graph(manifest: Manifest, graph: str, device: str) -> str:
    """The in-place graph on the CPU when the artifact has it and it is exact (float activations, or
    level 4 with the extra attention row); CUDA keeps the portable graph (DeviceKV). For SmolLM2's GGUF
    weights the in-place graph (packed q|k|v, rotary inside the attention) is faster up to a past of
    256 and even at 1024 (the extra row takes GroupQueryAttention's many-row path, whose cost grows with
    the past); greedy 1.17x the portable graph's tokens/s on 8 prompts (benchmarks/graph_bench)."""
    if graph not in ("auto", PORTABLE, INPLACE):
        raise BackendError(f"graph must be auto, {PORTABLE} or {INPLACE}, not {graph!r}")
    has_inplace = INPLACE in manifest.graphs
    if graph == "auto":  # an in-place graph the export could not check against PyTorch is not chosen for you
        exact = not int8_activations(manifest) or manifest.attention_extra_row
        return INPLACE if has_inplace and device == "cpu" and exact and not manifest.inplace_unchecked else PORTABLE
    if graph == INPLACE and not has_inplace:
        skipped = manifest.inplace_skipped
        why = f" ({skipped})" if skipped else "; re-export it with this jacobi-rt to add it"
        raise BackendError(f"this artifact has no in-place graph{why}; use the portable graph")
    if graph == INPLACE and device != "cpu":
        raise BackendError(
            "the in-place graph runs on the CPU provider only for now; use --graph portable (or auto) on CUDA"
        )
    if graph == INPLACE and manifest.inplace_unchecked:
        warnings.warn(
            f"this artifact's in-place graph was not checked against PyTorch ({manifest.inplace_unchecked}); "
            "its output is exact between strategies but unproven against the model: graph='auto' takes the "
            "checked portable graph",
            stacklevel=4,
        )
    return graph


def _pick_device(ort, device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise BackendError(f"backend device must be auto, cpu or cuda, not {device!r}")
    if device == "cpu":
        return "cpu"
    if "CUDAExecutionProvider" in ort.get_available_providers() and device_count() > 0:
        return "cuda"
    if device == "cuda":
        raise BackendError(
            "CUDA was asked for, but onnxruntime has no CUDAExecutionProvider or no CUDA runtime was found; "
            "install onnxruntime-gpu on a machine with an NVIDIA GPU (pip install onnxruntime-gpu, "
            'or ".[gpu]" from the jacobi-rt checkout), or use --backend cpu'
        )
    return "cpu"


class OrtContext(OrtBinding):
    def __init__(self, backend: OrtBackend, capacity: int, batch: int):
        super().__init__(backend, capacity, batch, backend.device)
        arch = backend.manifest.architecture
        self.length = 0
        self.heads, self.head_dim = arch.kv_heads, arch.head_dim
        self.dtype = np.dtype(backend.manifest.dtype)  # the KV cache's: "float32" or "float16"
        self.past_names = [t.name for t in kv_inputs(arch.num_layers)]
        self.present_names = [t.name for t in kv_outputs(arch.num_layers)]
        elements = batch * self.heads * (capacity + backend.spare_entries) * self.head_dim
        self.row_bytes = elements * self.dtype.itemsize
        # Two sides x (layers * 2) rows of B*H*capacity*D elements: np.empty leaves pages untouched
        # until the cache grows into them, so a large capacity costs address space, not RAM.
        self._allocate(len(self.past_names), elements)
        self._current = 0

    def _allocate(self, rows: int, elements: int) -> None:
        self._kv = [np.empty((rows, elements), dtype=self.dtype) for _ in range(2)]

    def _addresses(self, side: int, length: int) -> list[int]:
        """Each KV row's address on `side` for a cache of `length` entries (rows are a whole capacity apart)."""
        base = self._kv[side].ctypes.data
        return [base + row * self.row_bytes for row in range(len(self.past_names))]

    def forward(self, ids, positions=None, window_mask=None, want_logits=False) -> StepOutput:
        out = super().forward(ids, positions, window_mask, want_logits)
        self._current ^= 1  # the present side, written by the pass, holds the cache now
        return out

    def _bind_cache(self, past: int, total: int) -> None:
        shape_past = [self.batch, self.heads, past, self.head_dim]
        shape_total = [self.batch, self.heads, total, self.head_dim]
        sources, targets = self._addresses(self._current, past), self._addresses(self._current ^ 1, total)
        for inp, out, src, dst in zip(self.past_names, self.present_names, sources, targets):
            self._bind_in(inp, self.dtype, shape_past, src)
            self._bind_out(out, self.dtype, shape_total, dst)

    def _gather(self, old: int, rows: list[int]) -> None:
        past = self.length
        keep = np.asarray(rows, dtype=np.int64) + past
        size = self.batch * self.heads * old * self.head_dim
        for row in range(len(self.past_names)):
            blocks = self._kv[self._current][row, :size].reshape(self.batch * self.heads, old, self.head_dim)
            blocks[:, past : past + len(rows)] = blocks[:, keep]  # the gather reads a copy: W rows, not the cache
        self._compact(old, past + len(rows))

    def _compact(self, old: int, new: int) -> None:
        """[B*H, old, D] -> [B*H, new, D] in every row of the current side: block bh moves down."""
        self.length = new
        if new == old:
            return
        item = self.dtype.itemsize
        block_old, block_new = old * self.head_dim * item, new * self.head_dim * item
        for start in self._addresses(self._current, new):
            for bh in range(1, self.batch * self.heads):  # block 0 is already in place
                ctypes.memmove(start + bh * block_new, start + bh * block_old, block_new)

    def kv(self, layer: int, kind: str = "key") -> np.ndarray:
        """The committed cache of one layer, [B, H, length, D] (a view, for tests and tools)."""
        row = 2 * layer + (kind == "value")
        size = self.batch * self.heads * self.length * self.head_dim
        return self._kv[self._current][row, :size].reshape(self.batch, self.heads, self.length, self.head_dim)

    def close(self) -> None:
        self._kv = None


class OrtDeviceContext(DeviceKVContext, OrtContext):
    """The CUDA execution provider's context: the KV cache lives in device memory (a DeviceKV) and is
    bound by address, so onnxruntime reads the past and writes the present on the GPU; ids, positions
    and masks are bound from the host (onnxruntime uploads them) and greedy ids come back. Rejected
    entries are dropped by one device copy per kept run, on our stream, synchronised before the next
    run since onnxruntime uses its own stream. `memory` defaults to CUDA; tests pass a host double."""

    def __init__(self, backend: OrtBackend, capacity: int, batch: int, memory=None):
        self._memory = memory
        self._stream = None
        if memory is None:
            cuda = load_cudart()
            self._stream = (cuda, cuda.stream_create())
            self._memory = CudaMemory(cuda, self._stream[1])
        try:
            super().__init__(backend, capacity, batch)
        except Exception:
            self.close()  # what was allocated before the failure: a KV side, the stream
            raise

    def _allocate(self, rows: int, elements: int) -> None:
        entry = self.head_dim * self.dtype.itemsize
        self._kv = DeviceKV(
            self._memory, rows, self.batch * self.heads, self.capacity + self.backend.spare_entries, entry
        )

    def _addresses(self, side: int, length: int) -> list[int]:
        return self._kv.addresses(side, length)

    def _after_copy(self) -> None:
        self._memory.synchronize()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        release([super().close, *([lambda: stream[0].stream_destroy(stream[1])] if stream is not None else [])])
