"""A model's weights read from its files one tensor at a time, as transformers would load them.

`open_source(source, model)` checks, before reading any weight, that every parameter of `model`
(a skeleton: parameters may be on the meta device) is in the files with its shape and a type that
can be streamed; `read(key, dtype)` then gives one tensor, bit for bit what
`from_pretrained(..., dtype=torch.float32)` holds for it, cast to `dtype`.

- Hugging Face folders: safetensors files, the checkpoint keys renamed by transformers' own rules
  (`get_model_conversion_mapping`, base-model prefix added or dropped). Tensors are read with plain
  file reads, not memory maps: a map's touched pages count in the process's RSS until it is closed.
- GGUF files: tensor names mapped and values processed (Llama's q/k row order, gpt2's transposes)
  by transformers' GGUF loader's own map and TensorProcessor, one tensor de-quantized at a time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jacobi_rt.runtime.errors import ModelSourceError

from ..sources import ModelSource, load, load_tokenizer

STREAMED_DTYPES = ("F32", "F16", "BF16")  # safetensors dtypes transformers loads as plain float casts


@dataclass
class Blocks:
    """A GGUF tensor's own data for `--weights gguf`: the HF parameter is `raw`'s rows in `rows` order
    (HF row i = GGUF row rows[i]), transposed afterwards when `transposed` (gpt2's Conv1D weights)."""

    kind: str  # GGUF tensor type name: "Q4_1", "F32", ...
    raw: np.ndarray  # as stored: uint8 [N, bytes per row] for block types, the floats for float types
    shape: tuple[int, ...]  # the GGUF tensor's values, numpy order ([N, K] for a matrix)
    rows: np.ndarray  # int64 [N]
    transposed: bool = False


class NotStreamable(ModelSourceError):
    """The source is fine, but only transformers' whole-model load can read it (a weight conversion)."""


class WeightSource:
    """keys() are the model's parameter names (tied ones included); each maps to one stored tensor."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, ...]] = {}

    def keys(self) -> list[str]:
        return list(self._shapes)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[key]

    def read(self, key: str, dtype):
        import torch

        tensor = self._read_float32(key)
        return tensor if dtype == torch.float32 else tensor.to(dtype)

    def _read_float32(self, key: str):
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_source(source: ModelSource, model) -> WeightSource:
    """The weights of `source` for the parameters of `model`; ModelSourceError before any read if they don't fit."""
    if source.gguf_file:
        return GgufSource(source.folder / source.gguf_file, model)
    return SafetensorsSource(source.folder, model)


def _needed(model) -> dict[str, tuple[tuple[int, ...], list[str]]]:
    """parameter name -> (shape, its tied twins): named_parameters(remove_duplicate=False) and the model's tie map."""
    twins: dict[int, list[str]] = {}
    shapes = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        twins.setdefault(id(p), []).append(name)
        shapes[name] = (tuple(p.shape), twins[id(p)])
    for target, origin in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        if target in shapes and origin in shapes and origin not in shapes[target][1]:
            shapes[target][1].append(origin)
    return {name: (shape, [t for t in group if t != name]) for name, (shape, group) in shapes.items()}


def _resolve(model, stored: set[str], where: str) -> dict[str, str]:
    """parameter -> the stored name it is read from (itself, or its tied twin's)."""
    found = {}
    for name, (_, twins) in _needed(model).items():
        hit = next((n for n in [name, *twins] if n in stored), None)
        if hit is None:
            raise ModelSourceError(
                f"{where}: the model's parameter {name} is not in the weight files; "
                "the files are incomplete or belong to another architecture: download them again"
            )
        found[name] = hit
    return found


# --- safetensors ---------------------------------------------------------------------------------


@dataclass
class _Stored:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int
    checkpoint_key: str


class SafetensorsSource(WeightSource):
    def __init__(self, folder: Path, model):
        super().__init__()
        folder = Path(folder)
        stored = {}  # model key -> _Stored
        converted = {}  # model key -> checkpoint key, for keys transformers converts (fuses, splits)
        rename = _renamer(model)
        for file, keys in _files(folder).items():
            for ckpt_key, entry in _header(file).items():
                if keys is not None and ckpt_key not in keys:
                    continue
                key, converter = rename(ckpt_key)
                (converted if converter else stored)[key] = entry if not converter else ckpt_key
        needed = _needed(model)
        self._entries: dict[str, _Stored] = {}
        for name, hit in _resolve(model, set(stored) | set(converted), str(folder)).items():
            if hit in converted:
                raise NotStreamable(
                    f"{folder}: {converted[hit]} becomes {name} through one of transformers' weight "
                    "conversions (not a rename), which streaming does not do; export with the in-memory load"
                )
            entry = stored[hit]
            if entry.dtype not in STREAMED_DTYPES:
                raise ModelSourceError(
                    f"{entry.file}: tensor {entry.checkpoint_key} is {entry.dtype}; streaming reads "
                    f"{', '.join(STREAMED_DTYPES)} only: export a float checkpoint of the model"
                )
            if entry.shape != needed[name][0]:
                raise ModelSourceError(
                    f"{entry.file}: tensor {entry.checkpoint_key} has shape {list(entry.shape)}, the model's "
                    f"{name} needs {list(needed[name][0])}: config.json and the weights disagree"
                )
            self._shapes[name], self._entries[name] = entry.shape, entry
        self._handles: dict[Path, object] = {}

    def _read_float32(self, key: str):
        import torch

        entry = self._entries[key]
        handle = self._handles.get(entry.file) or self._handles.setdefault(entry.file, open(entry.file, "rb"))
        buffer = torch.empty(entry.nbytes, dtype=torch.uint8)
        handle.seek(entry.start)
        if handle.readinto(buffer.numpy()) != entry.nbytes:
            raise ModelSourceError(
                f"{entry.file}: tensor {entry.checkpoint_key} was cut short (the file changed while exporting)"
            )
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[entry.dtype]
        return buffer.view(dtype).reshape(entry.shape).to(torch.float32)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


def _files(folder: Path) -> dict[Path, set[str] | None]:
    """file -> the keys the index assigns to it (None: all of its keys), in transformers' order of preference."""
    if (folder / "model.safetensors").is_file():
        return {folder / "model.safetensors": None}
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelSourceError(f"{index}: not a safetensors index ({exc}); download it again") from exc
        files: dict[Path, set[str]] = {}
        for key, name in weight_map.items():
            files.setdefault(folder / name, set()).add(key)
        return files
    shards = sorted(folder.glob("model-*-of-*.safetensors")) or sorted(folder.glob("*.safetensors"))
    if shards:
        return dict.fromkeys(shards)
    if any(folder.glob("*.bin")):
        raise ModelSourceError(
            f"{folder}: the weights are .bin files; streaming them needs safetensors. Convert once with: python -c "
            '"from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; '
            f"M.from_pretrained('{folder}').save_pretrained('OUT'); "
            f"T.from_pretrained('{folder}').save_pretrained('OUT')\" "
            "and export OUT"
        )
    raise ModelSourceError(f"{folder}: no *.safetensors weight files")


def _header(file: Path) -> dict[str, _Stored]:
    """A safetensors file's tensors: 8 bytes of header length, the JSON header, then the data."""
    if not file.is_file():
        raise ModelSourceError(f"{file}: named by model.safetensors.index.json but missing; download it again")
    size = file.stat().st_size
    with open(file, "rb") as f:
        try:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"header length {length} exceeds the file")
            header = json.loads(f.read(length))
        except (struct.error, ValueError) as exc:
            raise ModelSourceError(f"{file}: not a readable safetensors file ({exc}); download it again") from exc
    base, out = 8 + length, {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if base + end > size:
            raise ModelSourceError(
                f"{file}: tensor {key} ends past the end of the file ({size} bytes): "
                "the file is truncated, download it again"
            )
        out[key] = _Stored(file, info["dtype"], tuple(info["shape"]), base + begin, end - begin, key)
    return out


def _renamer(model):
    """checkpoint key -> (model key, whether a converter rather than a rename produced it), by transformers' rules."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None

    def rename(key: str) -> tuple[str, bool]:
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        return renamed, pattern is not None

    return rename


# --- GGUF ----------------------------------------------------------------------------------------


class GgufSource(WeightSource):
    def __init__(self, path: Path, model):
        super().__init__()
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

        self.path = Path(path)
        reader = GGUFReader(str(self.path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        # the skeleton's config is the one transformers builds from this file (the processor reads its head counts)
        self._processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
        try:
            self._names = get_gguf_hf_weights_map(_TopLevel(model), self._processor)  # GGUF name -> HF name
        except NotImplementedError as exc:
            raise ModelSourceError(f"{self.path}: transformers has no GGUF name map for this model ({exc})") from exc
        hf_to_gguf: dict[str, str] = {}
        for gguf_name, hf_name in self._names.items():
            hf_to_gguf.setdefault(hf_name, gguf_name)
        tensors = {t.name: t for t in reader.tensors}
        stored = {hf for hf, g in hf_to_gguf.items() if g in tensors}
        needed = _needed(model)
        self._entries = {}
        for name, hit in _resolve(model, stored, str(self.path)).items():
            tensor = tensors[hf_to_gguf[hit]]
            _check_type(self.path, tensor)
            rows, transposed = self._layout(tensor)
            shape = _values_shape(tensor)[::-1] if transposed else _values_shape(tensor)
            if shape != needed[name][0]:
                raise ModelSourceError(
                    f"{self.path}: GGUF tensor {tensor.name} gives shape {list(shape)}, the model's {name} "
                    f"needs {list(needed[name][0])}: the GGUF metadata and its tensors disagree"
                )
            self._shapes[name] = shape
            self._entries[name] = (tensor, rows, transposed)

    def config(self) -> dict:
        """The config dict transformers builds for this GGUF (load_gguf_checkpoint without tensors: seconds)."""
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        return load_gguf_checkpoint(str(self.path), return_tensors=False)["config"]

    def blocks(self, key: str) -> Blocks:
        tensor, rows, transposed = self._entries[key]
        return Blocks(tensor.tensor_type.name, self._raw(tensor), _values_shape(tensor), rows, transposed)

    def _read_float32(self, key: str):
        import torch
        from gguf.quants import dequantize

        tensor = self._entries[key][0]
        result = self._process(dequantize(self._raw(tensor), tensor.tensor_type), tensor.name)
        return torch.from_numpy(np.copy(result)).to(torch.float32)

    def _process(self, weights: np.ndarray, name: str) -> np.ndarray:
        """transformers' TensorProcessor on one tensor (gpt2's puts lm_head straight into `parsed`)."""
        parsed: dict = {"tensors": {}}
        result = self._processor.process(
            weights=weights, name=name, tensor_key_mapping=self._names, parsed_parameters=parsed
        )
        return result.weights if result.name is not None else next(iter(parsed["tensors"].values())).numpy()

    def _layout(self, tensor) -> tuple[np.ndarray, bool]:
        """The processor's row order, found by processing the row numbers instead of the values."""
        n = _values_shape(tensor)[0]
        if len(_values_shape(tensor)) != 2:
            return np.arange(n), False
        order = np.asarray(self._process(np.arange(n, dtype=np.int64).reshape(n, 1), tensor.name))
        return (order[0], True) if order.shape == (1, n) else (order[:, 0], False)

    def _raw(self, tensor) -> np.ndarray:
        """The tensor's stored bytes, read from the file (the reader's memory map is left untouched)."""
        with open(self.path, "rb") as f:
            f.seek(int(tensor.data_offset))
            data = np.fromfile(f, dtype=np.uint8, count=int(tensor.n_bytes))
        if data.size != int(tensor.n_bytes):
            raise ModelSourceError(
                f"{self.path}: GGUF tensor {tensor.name} was cut short (the file changed while exporting)"
            )
        return data.view(tensor.data.dtype).reshape(tensor.data.shape)


class _TopLevel:
    """The model as get_gguf_hf_weights_map sees it, without its children: that helper maps every
    submodule again (13 s for SmolLM2-135M here) and finds nothing new for these families."""

    def __init__(self, model):
        self.config, self.state_dict = model.config, model.state_dict

    def named_children(self):
        return iter(())


def _values_shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's values in numpy order (ne reversed)."""
    return tuple(int(x) for x in reversed(tensor.shape))


def _check_type(path: Path, tensor) -> None:
    """gguf can de-quantize this tensor type (tried on one zero block)."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    block, size = GGML_QUANT_SIZES.get(tensor.tensor_type, (1, 0))
    try:
        dequantize(np.zeros((1, size), np.uint8), tensor.tensor_type)
    except Exception as exc:  # NotImplementedError for types gguf cannot decode; others for integer types
        raise ModelSourceError(
            f"{path}: GGUF tensor {tensor.name} is {tensor.tensor_type.name}, which the gguf package "
            f"cannot de-quantize ({exc}); use a GGUF file with another quantization type"
        ) from exc


@dataclass
class OpenedModel:
    """What the export traces (`model`), where its weights come from (`read`), and its tokenizer.

    streamed: `model` is a skeleton (skeleton.py) whose weights are read one tensor at a time from
    the source files; else the whole model was loaded by transformers and `read` takes its tensors."""

    model: object
    tokenizer: object
    read: object  # skeleton.Read
    streamed: bool


def open_model(source: ModelSource, dtype: str = "float32", stream: bool = True) -> OpenedModel:
    """The model to export: streamed from its safetensors or GGUF tensors where it can be (and `stream`),
    else loaded whole (transformers de-quantizes a whole GGUF to float32 first)."""
    import torch
    from transformers import AutoConfig

    from ..graph.skeleton import build, state_dict_reader

    torch_dtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
    if stream and (source.gguf_file or any(source.folder.glob("*.safetensors"))):
        kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
        try:
            config = AutoConfig.from_pretrained(source.folder, **kwargs)  # a GGUF's from its metadata
        except Exception as exc:
            raise ModelSourceError(
                f"{source.name}: transformers could not read its config ({type(exc).__name__}: {exc})"
            ) from exc
        model = build(config, torch_dtype)
        if (
            not source.gguf_file and (source.folder / "generation_config.json").is_file()
        ):  # its EOS ids, as from_pretrained reads them
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig.from_pretrained(source.folder)
        try:
            weights = open_source(source, model)
        except NotStreamable:
            weights = None
        if weights is not None:
            return OpenedModel(
                model, load_tokenizer(source), lambda name: weights.read(name, torch_dtype).numpy(), True
            )
    model, tokenizer = load(source, dtype)
    return OpenedModel(model, tokenizer, state_dict_reader(model), False)
