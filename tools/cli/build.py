"""`jacobi-rt build`: a TensorRT engine from an artifact's ONNX, recorded in its manifest."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("build")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--precision",
    type=click.Choice(["fp16", "bf16", "fp32", "fp8", "int8"]),
    default="fp16",
    show_default=True,
    help="Compute precision. fp8/int8 only where the ONNX carries QuantizeLinear/DequantizeLinear nodes.",
)
@click.option(
    "--max-batch", type=click.IntRange(min=1), default=1, show_default=True, help="Largest batch the engine serves."
)
@click.option(
    "--max-context",
    type=click.IntRange(min=2),
    default=None,
    help="Longest sequence (prompt + output) the engine serves. Default: the artifact's max_context.",
)
@click.option(
    "--decode-window",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Widest window of the decode profile, whose kernels are tuned for decoding passes.",
)
@click.option(
    "--prefill-window",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Widest window of the prefill profile (the runtime prefills prompts in chunks of 256).",
)
@click.option(
    "--opt-level",
    type=click.IntRange(0, 5),
    default=None,
    help="TensorRT builder optimization level (TensorRT's default: 3; higher builds longer).",
)
@click.option(
    "--workspace", type=click.FloatRange(min=0.1), default=None, help="Cap on the builder's scratch GPU memory, in GiB."
)
@click.option(
    "--timing-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="Tactic timing cache to reuse and extend. Default: ~/.cache/jacobi-rt/tensorrt/timing-<version>-<sm>.cache",
)
@click.option("--no-timing-cache", is_flag=True, help="Time every tactic afresh and keep no cache.")
@click.option(
    "--check",
    is_flag=True,
    help="Compare the engine's logits and greedy ids with onnxruntime (CPU) on random windows and record the figures.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def build_command(
    artifact,
    precision,
    max_batch,
    max_context,
    decode_window,
    prefill_window,
    opt_level,
    workspace,
    timing_cache,
    no_timing_cache,
    check,
    quiet,
):
    """Build a TensorRT engine for the GPU of this machine from ARTIFACT (written by `jacobi-rt export`).

    The engine goes to ARTIFACT/engines/<gpu>-<sm>-<precision>.plan and is recorded in its
    jacobi.json (TensorRT version, GPU, compute capability, precision, profiles, sha256). It runs
    only on GPUs of the same compute capability with the same TensorRT version; the runtime
    refuses any other and says how to rebuild. Needs an NVIDIA GPU and pip install ".[tensorrt]"
    from the jacobi-rt checkout.

    \b
    Examples:
      jacobi-rt build build/smollm2-135m
      jacobi-rt build build/smollm2-135m --precision bf16 --max-context 4096 --check
      jacobi-rt generate build/smollm2-135m --backend tensorrt --chat "Write a haiku"
    """
    from jacobi_rt.engines import BuildOptions, Limits, build_engine
    from jacobi_rt.runtime.errors import InputError

    if timing_cache and no_timing_cache:
        raise InputError("--timing-cache and --no-timing-cache do not mix; pick one")
    options = BuildOptions(
        precision=precision,
        limits=Limits(max_batch, max_context, decode_window, prefill_window),
        timing_cache=Path(timing_cache) if timing_cache else None,
        use_timing_cache=not no_timing_cache,
        optimization_level=opt_level,
        workspace_gib=workspace,
        check=check,
        progress=not quiet,
    )
    record = build_engine(artifact, options, log=lambda line: click.echo(line, err=True))
    click.echo(
        f"{Path(artifact) / record.file}  ({record.precision}, TensorRT {record.tensorrt_version}, "
        f"{record.gpu_name}, built in {record.build_seconds:.0f} s)"
    )
