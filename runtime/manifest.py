"""The artifact manifest, `jacobi.json`: what an artifact folder holds, and its validation.

Written by the exporter (and extended by the engine builder), read by the runtime before it
loads anything. Every file's sha256 is recorded (`files`), and its size and sampled digest
(`samples`, runtime/file_digest.py): loading checks the size and sampled digest (a few MB read
per file), `verify="full"` and `jacobi-rt verify` every byte. A missing, truncated or extended
file, or one changed inside a sampled block, is caught at load with an error that names it; a
change outside the sampled blocks only by the full check.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .errors import ArtifactError, OptionError
from .file_digest import MODES, matches_sample, sha256_file
from .manifest_checks import check_fields, check_inside, check_names
from .spec import FORMAT_VERSION, MANIFEST_NAME


@dataclass
class Architecture:
    family: str  # "llama", "qwen2", "mistral", "gpt2", ...
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int


@dataclass
class Tokens:
    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None


@dataclass
class EngineRecord:
    """A TensorRT engine added by `jacobi-rt build`, and what it is tied to (see engines/records.py)."""

    file: str  # relative to the artifact: "engines/<gpu>-<sm>-<precision>.plan"
    sha256: str
    precision: str  # "fp16", "bf16", "fp32", "fp8", "int8"
    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "9.0": engines run only on GPUs of the same compute capability
    profiles: list[dict]  # [{"name": "decode", "batch": [min, opt, max], "window": [...], "past": [...]}]
    build_seconds: float
    backend: str = "tensorrt"
    created: str = ""  # UTC date and time of the build
    check: dict = field(default_factory=dict)  # `--check`: the engine vs onnxruntime figures

    @classmethod
    def from_dict(cls, data: dict) -> EngineRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # newer fields are ignored


@dataclass
class Manifest:
    format_version: int
    role: str  # "target" or "draft"
    source: dict  # {"kind": "hf-folder"|"gguf"|"builtin", "name": ..., "sha256": ...}
    architecture: Architecture
    tokens: Tokens
    dtype: str  # "float32" or "float16": the KV cache dtype
    opset: int
    max_context: int
    quantization: (
        str | None
    )  # None, "int8", "int4" (--quantize) or "gguf" (a GGUF's own blocks); details in check["weights"]
    graphs: dict[str, str]  # variant -> file: "portable" (TensorRT, any EP), "onnxruntime" (ORT-optimized)
    tokenizer: dict  # {"vocab_sha256": ..., "files": [...], "chat_template": bool}
    files: dict[str, str]  # relative path -> sha256
    check: dict = field(default_factory=dict)  # export check figures
    engines: list[EngineRecord] = field(default_factory=list)  # TensorRT engines, added by `jacobi-rt build`
    created: dict = field(default_factory=dict)  # tool version, date, export seconds
    samples: dict[str, dict] = field(
        default_factory=dict
    )  # file -> {size, sampled_sha256, blocks, block_size}; absent before

    # What the runtime reads of the export's check report, typed and in one place:

    @property
    def accuracy_level(self) -> int | None:
        """MatMulNBits' accuracy level of quantized weights (4: int8 activations); None when not quantized."""
        if not self.quantization:
            return None
        return int((self.check.get("weights") or {}).get("accuracy_level", 4))

    @property
    def attention_extra_row(self) -> bool:
        """The in-place graph's GroupQueryAttention runs one extra query row (exporter/attention/gqa_rows.py), so
        no one-token pass takes its one-row path; its cache needs one spare entry, which the extra row's key and
        value are written into when a window ends at the capacity. Said by the in-place trace (float weights and
        level 4) or by the weight pass (level 4 on a `graphs_from` source)."""
        inplace, weights = self.check.get("inplace") or {}, self.check.get("weights") or {}
        return bool(inplace.get("extra_row") or weights.get("attention_extra_row"))

    @property
    def inplace_attention(self) -> str | None:
        """How the in-place graph writes the cache: "scatter" (reads the whole capacity) or "gqa"; None without one."""
        return (self.check.get("inplace") or {}).get("attention")

    @property
    def check_method(self) -> str:
        """How the export compared the portable graph with PyTorch: "full" (the whole graph against the
        whole model; manifests from before the layer-by-layer check say nothing, and ran this) or
        "layer by layer" (each stage alone, then chained; check["vs_pytorch"]["stages"])."""
        return (self.check.get("vs_pytorch") or {}).get("method", "full")

    @property
    def inplace_unchecked(self) -> str | None:
        """Why the in-place graph was exported unchecked (the portable graph checked layer by layer), when it was."""
        record = self.check.get("inplace") or {}
        return record.get("unchecked", "its record says no check ran") if record.get("method") == "none" else None

    @property
    def inplace_skipped(self) -> str | None:
        """Why the export has no in-place graph, when it says."""
        return (self.check.get("inplace") or {}).get("skipped")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        data = dict(data)
        data["architecture"] = Architecture(**data["architecture"])
        data["tokens"] = Tokens(**data["tokens"])
        data["engines"] = [EngineRecord.from_dict(e) for e in data.get("engines") or []]
        return cls(**data)


def read_manifest(folder: str | Path) -> Manifest:
    """Read and structurally validate `jacobi.json`; files are not hashed here (see verify_files)."""
    folder = Path(folder)
    if not folder.exists():
        raise ArtifactError(
            f"artifact folder {folder} does not exist; create it with `jacobi-rt export MODEL --out {folder}`"
        )
    if not folder.is_dir():
        raise ArtifactError(
            f"{folder} is a file, not an artifact folder; pass the folder that `jacobi-rt export` wrote"
        )
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"{folder} has no {MANIFEST_NAME}: it is not a jacobi-rt artifact (or its export did not finish); "
            "re-export it with `jacobi-rt export`"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); re-export the artifact") from exc
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} has format_version {version!r}, but this jacobi-rt reads format {FORMAT_VERSION}; "
            "re-export the model with this version of jacobi-rt (or install the version that wrote it)"
        )
    check_fields(data, path)
    try:
        manifest = Manifest.from_dict(data)
    except (TypeError, KeyError) as exc:
        raise ArtifactError(f"{path} is missing or has unexpected fields ({exc}); re-export the artifact") from exc
    check_names(manifest, path)
    return manifest


def verify_mode(verify: bool | str) -> str:
    """ "sampled" (size and sampled digest), "full" (every byte's sha256) or "none"; True means "sampled",
    False "none"."""
    if verify is True or verify is False:
        return "sampled" if verify else "none"
    if verify not in MODES:
        raise OptionError(f"`verify` must be one of {', '.join(MODES)} (or True/False), not {verify!r}", "verify")
    return verify


def verify_files(folder: str | Path, manifest: Manifest, names: list[str] | None = None, mode: str = "full") -> None:
    """Check that every recorded file (or just `names`) exists and matches its record: its sha256 ("full"), or its
    size and sampled digest ("sampled"; files recorded without one get the full check)."""
    folder = Path(folder)
    for name, expected in manifest.files.items():
        if names is not None and name not in names:
            continue
        path = check_inside(folder, name)
        if not path.is_file():
            raise ArtifactError(
                f"{path} is missing from the artifact; re-export it with `jacobi-rt export --overwrite`"
            )
        sample = manifest.samples.get(name) if mode == "sampled" else None
        if sample is not None:
            if not matches_sample(path, sample):
                raise ArtifactError(
                    f"{path} was changed after export (its size or sampled sha256 differs from {MANIFEST_NAME}); "
                    "re-export the artifact with `jacobi-rt export --overwrite`"
                )
        elif sha256_file(path) != expected:
            raise ArtifactError(
                f"{path} was changed after export (sha256 differs from {MANIFEST_NAME}); "
                "re-export the artifact with `jacobi-rt export --overwrite`"
            )


def load_manifest(folder: str | Path, verify: bool | str = "sampled") -> Manifest:
    """Read the manifest and check its files: verify "sampled" (the default; True), "full" or "none" (False)."""
    mode = verify_mode(verify)
    manifest = read_manifest(folder)
    if mode != "none":
        verify_files(folder, manifest, mode=mode)
    return manifest


def manifest_sha256(folder: str | Path) -> str | None:
    """The sha256 of `folder`'s manifest, which pins the whole artifact (it holds every file's digest);
    None when the folder has no manifest."""
    path = Path(folder) / MANIFEST_NAME
    return sha256_file(path) if path.is_file() else None
