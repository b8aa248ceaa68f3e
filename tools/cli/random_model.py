"""`jacobi-rt random-model`: random weights of a real checkpoint's shape, to try the toolkit at size."""

from __future__ import annotations

from pathlib import Path

import click

from jacobi_rt.tools.random_shapes import CONFIGS


@click.command("random-model")
@click.argument("name", type=click.Choice(list(CONFIGS)))
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(),
    help="Folder for the Hugging Face model (safetensors shards), or a .gguf file for a GGUF alone.",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default="bf16",
    show_default=True,
    help="Dtype of the safetensors weights.",
)
@click.option(
    "--gguf",
    "gguf_type",
    type=click.Choice(["Q4_0", "Q8_0", "Q4_K_M"]),
    default=None,
    help="Also write OUT/model-<TYPE>.gguf (or only the GGUF when OUT ends in .gguf); llama-family shapes only.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the random values (the same seed and NAME give the same weights).",
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    default=None,
    help="Keep only the first N decoder layers (a smaller model of the same width).",
)
@click.option(
    "--shard-size",
    type=click.FloatRange(min=0.001),
    default=4.0,
    show_default=True,
    help="Largest safetensors shard, in GB.",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def random_model_command(name, out, dtype, gguf_type, seed, layers, shard_size, overwrite, quiet):
    """Write a random-weight model of NAME's shape (its real config.json; SmolLM2's 49,152-token tokenizer).

    \b
    Shapes: llama-3-8b, qwen2.5-7b, mistral-7b, tinyllama-1.1b, smollm2-135m.
    Written shard by shard, tensor by tensor: memory stays small whatever the model's size.
    Example:
      jacobi-rt random-model llama-3-8b --out models/llama-3-8b
      jacobi-rt random-model llama-3-8b --gguf Q4_K_M --out models/llama-3-8b-q4_k_m.gguf
    """
    from jacobi_rt.runtime.errors import OptionError
    from jacobi_rt.tools.random_model import make_random_model

    try:
        report = make_random_model(
            name, Path(out), dtype, gguf_type, seed, layers, int(shard_size * 1e9), overwrite, quiet
        )
    except OptionError as exc:
        raise OptionError(
            exc.naming(lambda p: {"gguf": "--gguf", "overwrite": "--overwrite", "name": "NAME"}.get(p, p))
        ) from exc
    click.echo(
        f"{name}: {report.parameters / 1e9:.2f}B parameters, {report.bytes_written / 1e9:.2f} GB in "
        f"{len(report.files)} files, {report.seconds:.0f} s -> {out}"
    )
