"""TrtBackend: the window graph as a TensorRT 10 engine, the KV cache resident on the GPU.

One engine per artifact (built by `jacobi-rt build`, checked against this GPU and TensorRT before
it is deserialized); each generation opens a TrtContext: its own execution context, one CUDA
stream, and device buffers allocated once at the context's capacity. Per pass:

    pick the optimization profile covering (batch, window, past)   # switched only when it changes
    stage ids | positions | window_mask in pinned memory -> ONE host-to-device copy
    set the input shapes, bind the KV rows of the current and the other side (DeviceKV)
    execute_async_v3 -> copy greedy_ids (B*W ints) back -> synchronise the stream

attention_mask is all ones and stays on the device. Rejected window entries are dropped by
device copies on the same stream (device_kv.py), so nothing KV-sized crosses the bus.

CUDA graphs are not used: the past length grows every pass, so every pass has new input shapes
and a captured graph would be valid for one pass only. They would need a graph variant with a
fixed-capacity past (a format change); see docs/architecture.md.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from ..errors import BackendError, MissingDependencyError
from ..manifest import EngineRecord, Manifest
from ..spec import input_names, kv_inputs, kv_outputs
from .base import Backend, BackendLimits, StepOutput, window_inputs
from .cuda import DEVICE_TO_HOST, HOST_TO_DEVICE, CudaMemory, gpu_facts, load_cudart
from .device_kv import ALIGN, DeviceKV, DeviceKVContext, release, round_up
from .trt_plans import Profile, Range, pick_profile, rebuild_hint, select_engine, serving_limits, verify_engine_file

TENSORRT_HINT = (
    'pip install "tensorrt>=10" polygraphy (from the jacobi-rt checkout: pip install ".[tensorrt]") on a machine '
    "with an NVIDIA GPU (the tensorrt wheels fetch "
    "NVIDIA's libraries from pypi.nvidia.com)"
)
CONTRACT_TYPES = {
    "input_ids": np.int64,
    "position_ids": np.int64,
    "attention_mask": np.int64,
    "window_mask": np.bool_,
    "logits": np.float32,
}
NUMPY_TYPES = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "BF16": np.uint16,
    "INT64": np.int64,
    "INT32": np.int32,
    "BOOL": np.bool_,
    "INT8": np.int8,
    "UINT8": np.uint8,
}


def load_tensorrt():
    """The tensorrt module (10 or newer), or a MissingDependencyError with the install command."""
    try:
        import tensorrt as trt
    except (ImportError, OSError) as exc:  # OSError: the bindings are there but not NVIDIA's libraries
        raise MissingDependencyError(f"tensorrt is not installed ({exc}); install it with: {TENSORRT_HINT}") from exc
    if int(trt.__version__.split(".")[0]) < 10:
        raise MissingDependencyError(
            f"TensorRT {trt.__version__} is too old: jacobi-rt needs TensorRT 10; {TENSORRT_HINT}"
        )
    return trt


@functools.lru_cache(maxsize=1)
def trt_logger(trt):
    return trt.Logger(trt.Logger.WARNING)


class TrtBackend(Backend):
    """A deserialized engine, shared by threads; `context()` gives each generation its own state."""

    def __init__(
        self,
        folder: str | Path,
        manifest: Manifest,
        precision: str | None = None,
        verify: bool = True,
        record: EngineRecord | None = None,
    ):
        """Load the newest engine of `manifest` that runs here (of `precision`, if given), or `record`."""
        trt = load_tensorrt()
        self.trt, self.manifest, self.cuda = trt, manifest, load_cudart()
        self.gpu = gpu_facts(self.cuda)
        self.record: EngineRecord = record or select_engine(manifest, self.gpu, trt.__version__, folder, precision)
        path = verify_engine_file(folder, self.record) if verify else Path(folder) / self.record.file
        self.name = f"tensorrt-{self.record.precision}"
        self.rebuild = rebuild_hint(folder, self.record.precision)
        self.runtime = trt.Runtime(trt_logger(trt))
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BackendError(f"TensorRT could not deserialize {path} (see its log above); {self.rebuild}")
        self.dtypes = self._io_types()
        self.profiles = self._profiles()
        self._lock = threading.Lock()  # creating execution contexts from several threads at once

    def _io_types(self) -> dict[str, np.dtype]:
        engine, trt = self.engine, self.trt
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = {n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        layers = self.manifest.architecture.num_layers
        expected = set(input_names(layers))
        missing_outputs = {"greedy_ids", "logits", *(t.name for t in kv_outputs(layers))} - set(names)
        if inputs != expected or missing_outputs:
            raise BackendError(
                f"the engine's tensors do not match the window-graph contract for {layers} layers "
                f"(unexpected inputs: {sorted(inputs - expected)[:4]}, "
                f"missing: {sorted((expected - inputs) | missing_outputs)[:4]}); "
                f"{self.rebuild}"
            )
        dtypes = {n: _numpy_type(trt, engine.get_tensor_dtype(n)) for n in names}
        wrong = [f"{n} is {dtypes[n]}" for n, t in CONTRACT_TYPES.items() if dtypes[n] != np.dtype(t)]
        if wrong:
            raise BackendError(
                f"the engine's tensor types differ from the contract ({', '.join(wrong)}); {self.rebuild}"
            )
        return dtypes

    def _profiles(self) -> list[Profile]:
        out = []
        kv = kv_inputs(1)[0].name
        for i in range(self.engine.num_optimization_profiles):
            ids = [tuple(d) for d in self.engine.get_tensor_profile_shape("input_ids", i)]  # min, opt, max of [B, W]
            past = [tuple(d) for d in self.engine.get_tensor_profile_shape(kv, i)]  # of [B, H, P, D]
            name = self.record.profiles[i]["name"] if i < len(self.record.profiles) else f"profile {i}"
            out.append(
                Profile(name, Range(*(s[0] for s in ids)), Range(*(s[1] for s in ids)), Range(*(s[2] for s in past)))
            )
        return out

    @property
    def max_window(self) -> int:
        return max(p.window.max for p in self.profiles)

    @property
    def limits(self) -> BackendLimits:
        """The engine's profiles bound the context, the prefill chunk and the widest pass (`jacobi-rt build` limits)."""
        return serving_limits(self.profiles, self.manifest.max_context)

    def context(self, capacity: int, batch: int = 1) -> TrtContext:
        limit = min(self.manifest.max_context, max(p.total.max for p in self.profiles))
        return TrtContext(self, max(1, min(capacity, limit)), batch)

    def close(self) -> None:
        self.engine = self.runtime = None


def _numpy_type(trt, dtype) -> np.dtype:
    for name, numpy_type in NUMPY_TYPES.items():
        if getattr(trt.DataType, name, None) == dtype:
            return np.dtype(numpy_type)
    raise BackendError(
        f"the engine has a tensor of type {dtype}, which jacobi-rt does not handle; rebuild it from the artifact"
    )


class TrtContext(DeviceKVContext):
    def __init__(self, backend: TrtBackend, capacity: int, batch: int):
        arch = backend.manifest.architecture
        self.backend, self.cuda = backend, backend.cuda
        self.batch, self.capacity = batch, capacity
        self.length = self.pending = 0
        self.heads, self.head_dim, self.vocab = arch.kv_heads, arch.head_dim, arch.vocab_size
        self.past_names = [t.name for t in kv_inputs(arch.num_layers)]
        self.present_names = [t.name for t in kv_outputs(arch.num_layers)]
        self.dtype = backend.dtypes[self.past_names[0]]
        self.max_window = min(backend.max_window, capacity)
        self._device: list[int] = []
        self._host: list[int] = []
        self._kv = None
        self.stream = self.cuda.stream_create()
        try:
            self._allocate()
        except Exception:
            self.close()
            raise
        self._current, self._profile, self._shapes = 0, None, {}

    def _allocate(self) -> None:
        with self.backend._lock:
            self.context = self.backend.engine.create_execution_context()
        if self.context is None:
            raise BackendError(
                "TensorRT could not create an execution context (out of GPU memory?); "
                "close other contexts or lower the capacity"
            )
        b, w, item = self.batch, self.max_window, self.dtype.itemsize
        self._kv = DeviceKV(
            CudaMemory(self.cuda, self.stream),
            len(self.past_names),
            b * self.heads,
            self.capacity,
            self.head_dim * item,
        )
        # ids | positions | window_mask, one region each, staged in pinned memory and sent in one copy
        ids_bytes = round_up(b * w * 8, ALIGN)
        self._offsets = {"input_ids": 0, "position_ids": ids_bytes, "window_mask": 2 * ids_bytes}
        staged = 2 * ids_bytes + b * w * w
        self._inputs = self._device_alloc(staged)
        self._staging_ptr, staging = self._host_alloc(staged)
        self._stage = {
            "input_ids": staging[: b * w * 8].view(np.int64),
            "position_ids": staging[ids_bytes : ids_bytes + b * w * 8].view(np.int64),
            "window_mask": staging[2 * ids_bytes : staged].view(np.bool_),
        }
        greedy_type = self.backend.dtypes["greedy_ids"]
        self._greedy = self._device_alloc(b * w * greedy_type.itemsize)
        self._greedy_host_ptr, greedy_host = self._host_alloc(b * w * greedy_type.itemsize)
        self._greedy_host = greedy_host.view(greedy_type)
        self._logits = self._device_alloc(b * w * self.vocab * 4)
        self._ones = self._device_alloc(b * self.capacity * 8)  # attention_mask: all ones, uploaded once
        ones = np.ones(b * self.capacity, dtype=np.int64)
        self.cuda.copy_async(self._ones, ones.ctypes.data, ones.nbytes, HOST_TO_DEVICE, self.stream)
        self.cuda.stream_synchronize(self.stream)

    def _device_alloc(self, nbytes: int) -> int:
        self._device.append(self.cuda.malloc(nbytes))
        return self._device[-1]

    def _host_alloc(self, nbytes: int):
        ptr, view = self.cuda.host_malloc(nbytes)
        self._host.append(ptr)
        return ptr, view

    def forward(self, ids, positions=None, window_mask=None, want_logits=False) -> StepOutput:
        self._check_open()
        batch, window = self._check_window(ids)
        past, total = self.length, self.length + window
        self._select_profile(batch, window, past)
        nbytes = self._stage_inputs(ids, positions, window_mask, batch, window, past)
        self._set_shapes(batch, window, past, total)
        self._bind_kv(past, total)
        greedy_bytes = batch * window * self._greedy_host.itemsize
        logits = np.empty((batch, window, self.vocab), dtype=np.float32) if want_logits else None
        self.cuda.copy_async(self._inputs, self._staging_ptr, nbytes, HOST_TO_DEVICE, self.stream)
        if not self.context.execute_async_v3(self.stream):
            raise BackendError(
                f"TensorRT failed on a window of {window} after {past} cached entries (see its log above)"
            )
        self.cuda.copy_async(self._greedy_host_ptr, self._greedy, greedy_bytes, DEVICE_TO_HOST, self.stream)
        if logits is not None:
            self.cuda.copy_async(logits.ctypes.data, self._logits, logits.nbytes, DEVICE_TO_HOST, self.stream)
        self.cuda.stream_synchronize(self.stream)
        self._current ^= 1
        self.length, self.pending = past, window
        greedy = self._greedy_host[: batch * window].astype(np.int64).reshape(batch, window)
        return StepOutput(greedy, logits)

    def _select_profile(self, batch: int, window: int, past: int) -> None:
        index = pick_profile(self.backend.profiles, batch, window, past)
        if index is None:
            ranges = "; ".join(p.describe() for p in self.backend.profiles)
            raise BackendError(
                f"no optimization profile of the engine covers batch {batch}, window {window}, past {past} ({ranges}); "
                "rebuild it with larger limits "
                "(`jacobi-rt build ARTIFACT --max-batch/--decode-window/--prefill-window`)"
            )
        if index != self._profile:
            if not self.context.set_optimization_profile_async(index, self.stream):
                raise BackendError(f"TensorRT could not switch to optimization profile {index}")
            self._profile, self._shapes = index, {}
            self._bind_fixed()

    def _bind_fixed(self) -> None:
        """Addresses that never change: the staged inputs, the all-ones mask, greedy ids and logits."""
        fixed = {name: self._inputs + offset for name, offset in self._offsets.items()}
        fixed.update(attention_mask=self._ones, greedy_ids=self._greedy, logits=self._logits)
        for name, address in fixed.items():
            self._address(name, address)

    def _stage_inputs(self, ids, positions, window_mask, batch: int, window: int, past: int) -> int:
        """Write the window into pinned memory; returns the bytes to send."""
        ids, positions, window_mask = window_inputs(ids, positions, window_mask, past)
        self._stage["input_ids"][: batch * window] = ids.ravel()
        self._stage["position_ids"][: batch * window] = positions.ravel()
        self._stage["window_mask"][: batch * window * window] = window_mask.ravel()
        return self._offsets["window_mask"] + batch * window * window

    def _set_shapes(self, batch: int, window: int, past: int, total: int) -> None:
        shapes = {
            "input_ids": (batch, window),
            "position_ids": (batch, window),
            "window_mask": (batch, window, window),
            "attention_mask": (batch, total),
        }
        kv_shape = (batch, self.heads, past, self.head_dim)
        for name, shape in shapes.items():
            self._shape(name, shape)
        for name in self.past_names:
            self._shape(name, kv_shape)

    def _shape(self, name: str, shape: tuple) -> None:
        if self._shapes.get(name) != shape:
            if not self.context.set_input_shape(name, shape):
                raise BackendError(
                    f"TensorRT refused the shape {list(shape)} for {name} "
                    f"(outside optimization profile {self._profile})"
                )
            self._shapes[name] = shape

    def _bind_kv(self, past: int, total: int) -> None:
        sources, targets = self._kv.addresses(self._current, past), self._kv.addresses(self._current ^ 1, total)
        for inp, out, src, dst in zip(self.past_names, self.present_names, sources, targets):
            self._address(inp, src)
            self._address(out, dst)

    def _address(self, name: str, address: int) -> None:
        if not self.context.set_tensor_address(name, address):
            raise BackendError(f"TensorRT refused the device address of {name}")

    def close(self) -> None:
        """Free everything, even when a free fails (then the first failure is raised after the rest)."""
        device, host, stream = self._device, self._host, self.stream
        self._device, self._host, self.stream, self.context = [], [], 0, None
        cuda = self.cuda
        release(
            [
                super().close,  # the KV sides
                *(lambda ptr=ptr: cuda.free(ptr) for ptr in device),
                *(lambda ptr=ptr: cuda.host_free(ptr) for ptr in host),
                *([lambda: cuda.stream_destroy(stream)] if stream else []),
            ]
        )
