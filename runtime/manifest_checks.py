"""What `jacobi.json` must hold before anything it names is opened: field types, and file names.

Types: a manifest edited by hand, or written by another tool, fails here with the field's name and
what it should be, not with a traceback from deep inside the loader.

File names: every file the runtime opens (graphs, tokenizer, chat template, engines) is named
relative to the artifact folder, without `..` or an absolute path, so a manifest cannot make the
runtime read a file elsewhere (a chat template set to `/etc/hostname` would print it through
`chat_prompt`). The graphs, the tokenizer and the chat template must also be listed in `files`,
so their sha256 is checked before loading; an engine carries its own sha256 in its record. An ONNX
file's external-data names are confined by onnxruntime itself (see pyproject's onnxruntime pin).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from .errors import ArtifactError

_INT = "an integer"
_OBJECT = "an object"
# field -> (what it must be, check)
_TOP: dict[str, tuple[str, object]] = {
    "role": ('"target" or "draft"', lambda v: v in ("target", "draft")),
    "source": (_OBJECT, lambda v: isinstance(v, dict)),
    "architecture": (_OBJECT, lambda v: isinstance(v, dict)),
    "tokens": (_OBJECT, lambda v: isinstance(v, dict)),
    "dtype": ('"float32" or "float16"', lambda v: v in ("float32", "float16")),
    "opset": (_INT, lambda v: _is_int(v)),
    "max_context": ("a positive integer", lambda v: _is_int(v) and v >= 1),
    "quantization": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "graphs": (
        'an object mapping graph variants to file names, with a "portable" graph',
        lambda v: _str_map(v) and "portable" in v,
    ),
    "tokenizer": (_OBJECT, lambda v: isinstance(v, dict)),
    "files": ("an object mapping file names to sha256 strings", lambda v: _str_map(v)),
    "check": (_OBJECT, lambda v: isinstance(v, dict)),
    "engines": (
        "a list of engine records (objects)",
        lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
    ),
    "created": (_OBJECT, lambda v: isinstance(v, dict)),
    "samples": (
        "an object mapping file names to {size, sampled_sha256, blocks, block_size} records",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _sample(r) for k, r in v.items()),
    ),
}
_ARCHITECTURE_INTS = ("num_layers", "num_heads", "kv_heads", "head_dim", "hidden_size", "vocab_size", "max_positions")
CHECK_METHODS = ("full", "layer by layer")  # check["vs_pytorch"]["method"]; absent: full
_ENGINE_STRINGS = ("file", "sha256", "precision", "tensorrt_version", "compute_capability")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sample(record) -> bool:
    """A file's sampled-digest record (runtime/file_digest.py FileSample)."""
    if not isinstance(record, dict) or not isinstance(record.get("sampled_sha256"), str):
        return False
    return (
        _is_int(record.get("size"))
        and record["size"] >= 0
        and all(_is_int(record.get(k)) and record[k] >= 1 for k in ("blocks", "block_size"))
    )


def _str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _wrong(where: str, values, names, what: str, ok) -> list[str]:
    """A "`where.name` must be what" for each of `names` that `values` (when an object) holds and `ok` refuses."""
    if not isinstance(values, dict):
        return []
    return [f"`{where}.{name}` must be {what}" for name in names if name in values and not ok(values[name])]


def check_fields(data: dict, path: Path) -> None:
    """Raise an ArtifactError naming the first field of the wrong type (missing fields are left to the caller)."""
    problems = [f"`{name}` must be {what}" for name, (what, ok) in _TOP.items() if name in data and not ok(data[name])]
    arch, tokens, tokenizer = data.get("architecture"), data.get("tokens"), data.get("tokenizer")
    problems += _wrong("architecture", arch, _ARCHITECTURE_INTS, "a positive integer", lambda v: _is_int(v) and v > 0)
    problems += _wrong("architecture", arch, ["family"], "a string", lambda v: isinstance(v, str))
    problems += _wrong(
        "tokens", tokens, ["eos_ids"], "a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v))
    )
    problems += _wrong("tokens", tokens, ["bos_id", "pad_id"], "an integer or null", lambda v: v is None or _is_int(v))
    problems += _wrong("tokenizer", tokenizer, ["file"], "a string", lambda v: v is None or isinstance(v, str))
    problems += _wrong(
        "tokenizer", tokenizer, ["chat_template"], "a string or null", lambda v: v is None or isinstance(v, str)
    )
    check = data.get("check")
    problems += _wrong(
        "check.vs_pytorch",
        check.get("vs_pytorch") if isinstance(check, dict) else None,
        ["method"],
        '"full" or "layer by layer"',
        lambda v: v in CHECK_METHODS,
    )
    for i, engine in enumerate(data.get("engines") or []):
        problems += _wrong(f"engines[{i}]", engine, _ENGINE_STRINGS, "a string", lambda v: isinstance(v, str))
    if problems:
        raise ArtifactError(
            f"{path} has fields of the wrong type: {'; '.join(problems[:3])}; re-export the artifact "
            "(or fix jacobi.json by hand)"
        )


def confined(name: str) -> bool:
    """A relative name inside the folder: not absolute (POSIX or Windows), no drive, no `..` part."""
    if (
        not name
        or PurePosixPath(name).is_absolute()
        or PureWindowsPath(name).is_absolute()
        or PureWindowsPath(name).drive
    ):
        return False
    return ".." not in PureWindowsPath(name).parts and ".." not in PurePosixPath(name).parts


def opened_files(manifest) -> dict[str, str]:
    """Every file the runtime may open -> what it is, except engines (they carry their own sha256)."""
    named = {name: f"graph {variant!r}" for variant, name in manifest.graphs.items()}
    named[manifest.tokenizer.get("file") or "tokenizer.json"] = "tokenizer"
    if manifest.tokenizer.get("chat_template"):
        named[manifest.tokenizer["chat_template"]] = "chat template"
    return named


def check_names(manifest, path: Path) -> None:
    """Refuse file names that leave the folder, and opened files that are not listed (hashed) in `files`."""
    named = {**opened_files(manifest), **{name: "a listed file" for name in manifest.files}}
    named.update({record.file: "engine" for record in manifest.engines})
    for name, what in named.items():
        if not confined(name):
            raise ArtifactError(
                f"{path} names the {what} {name!r}, which is outside the artifact folder; file names "
                "in jacobi.json must be relative, without '..' (re-export the artifact)"
            )
    for name, what in opened_files(manifest).items():
        if name not in manifest.files:
            raise ArtifactError(
                f"{path} names the {what} {name!r} but does not list it in `files`, so its sha256 "
                "cannot be checked; re-export the artifact"
            )


def check_inside(folder: Path, name: str) -> Path:
    """folder / name, refused when a symbolic link takes it outside the folder."""
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()):
        raise ArtifactError(
            f"{path} leads outside the artifact folder (a symbolic link?); copy the file into the folder "
            "or re-export the artifact"
        )
    return path
