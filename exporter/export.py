"""`export()`: model source -> checked ONNX window graph -> artifact folder with its manifest.

The folder is assembled under a temporary name beside the destination and moved into place
only after the check passed, so an interrupted or failed export never leaves a folder that
looks valid.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from jacobi_rt import __version__
from jacobi_rt.runtime.errors import OptionError
from jacobi_rt.runtime.file_digest import file_records
from jacobi_rt.runtime.manifest import Architecture, Manifest, Tokens
from jacobi_rt.runtime.spec import FORMAT_VERSION, INPLACE, MANIFEST_NAME, PORTABLE

from . import sources
from .budget import QUANTIZED_SHARE, check_disk, check_method, needed_disk, staged_agreement, weight_bytes
from .destination import recover_interrupted
from .limits import ContextLimit, check_config, context_limit
from .options import ExportOptions, check_keep_layers, check_max_context
from .reuse import reuse_graphs
from .weights import weight_step
from .weights.weight_source import open_model

GRAPH_FILE = "model.onnx"
# Natural text for the quantized graph's agreement: random windows give flat, tie-prone logits.
SAMPLE_TEXT = (
    "Jacobi decoding guesses several future tokens at once and checks them in a single forward pass. "
    "Every guess that matches the model's own greedy prediction is kept, so the output is exactly what "
    "greedy decoding would produce. def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n"
)

Step = Callable[[str], None]


def export(
    model: str,
    out: str | Path,
    options: ExportOptions | None = None,
    *,
    overwrite: bool = False,
    step: Step = lambda message: None,
    check_progress: Callable[[int], Callable[[], None]] | None = None,
    write_progress: Callable[[int], Callable[[], None]] | None = None,
) -> Manifest:
    """Export MODEL (HF folder, .gguf, or built-in name) to the artifact folder OUT; return its manifest.

    overwrite: replace OUT if it is an existing artifact. step: called with a line per stage.
    check_progress(n): called as each check starts (n: its shapes, or its stages layer by layer); returns
    a callable ticked once per checked shape or stage (a progress bar). write_progress(n): likewise as
    each graph's n weights are written.
    Invalid options raise OptionError naming the ExportOptions field.
    """
    started = time.time()
    options = options or ExportOptions()
    out = Path(out).expanduser().resolve()
    _check_destination(out, overwrite)
    source = sources.resolve(model)
    options.validate()
    _check_limits(source, options)

    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    created = [p for p in out.parents if not p.exists()]  # deepest first: removed again if the export fails
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        _remove_empty(created)
        raise OptionError(
            f"cannot write to {out.parent} ({exc.strerror}); choose an `out` in a writable folder", "out"
        ) from exc
    try:
        manifest = _export_into(staging, source, options, step, check_progress, write_progress)
        manifest.created["export_seconds"] = round(time.time() - started, 1)
        manifest.created["peak_rss_mb"] = _peak_rss_mb()
        (staging / MANIFEST_NAME).write_text(manifest.to_json())
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        raise
    step(f"wrote {out}")
    return manifest


def _export_into(folder: Path, source, options: ExportOptions, step, check_progress, write_progress) -> Manifest:
    import torch

    from .checks.check import agreement_steps, check_against_onnx
    from .checks.layer_check import layer_scope
    from .graph.trace import probe

    dtype, quantize, opset, keep_layers = options.torch_dtype, options.quantize, options.opset, options.keep_layers
    opened = open_model(source, dtype, options.stream)
    model, tokenizer = opened.model, opened.tokenizer
    step(f"{'streaming' if opened.streamed else 'loaded'} {source.name} ({source.model_type})")
    if keep_layers is not None:
        step(f"keeping the first {keep_layers} decoder layers")
        keep_first_layers(model, keep_layers)
    shape = probe(model)
    config = model.config.to_dict()
    check_config(config, source.name)
    limit = context_limit(config) or ContextLimit(shape.max_positions, f"the model's {shape.max_positions} positions")
    max_context = limit.positions if options.max_context is None else options.max_context
    check_max_context(max_context, limit)
    source_info = source.describe()
    if keep_layers is not None:
        source_info["kept_layers"] = keep_layers
    kind = "gguf" if options.weights == "gguf" else quantize
    floats = weight_bytes(model)
    check_disk(folder, needed_disk(floats, kind) if not options.graphs_from else int(floats * QUANTIZED_SHARE[kind]))

    # reused graphs are not checked again: the method only says whether the agreement runs staged
    method = check_method("auto" if options.graphs_from else options.check, floats, options.check_memory)
    if options.graphs_from:
        step(f"reusing the checked graphs of {options.graphs_from}")
        graphs, check = reuse_graphs(Path(options.graphs_from).expanduser(), folder, source_info, options, max_context)
    else:
        graphs, check = _trace_and_check(
            opened, shape, folder, options, method, max_context, step, check_progress, write_progress
        )
    graph = folder / graphs[PORTABLE]

    weights = None
    if options.quantized:  # the same weight pass over every graph file
        gguf_path = source.folder / source.gguf_file if source.gguf_file else None
        weights = weight_step.quantize_graphs(
            folder, graphs, gguf_path, options, step, max_positions=shape.max_positions
        )
        sample_ids = tokenizer(SAMPLE_TEXT)["input_ids"][:max_context]
        staged = staged_agreement(method, floats)
        step(f"comparing the {weights.kind} graph with the float one{' layer by layer' if staged else ''}")
        progress = check_progress(agreement_steps(shape.num_layers, staged)) if check_progress else None
        report = check_against_onnx(
            graph,
            weight_step.staged(folder, GRAPH_FILE),
            shape,
            sample_ids,
            progress,
            max_context,
            layer_scope=layer_scope(model) if staged else None,
        )
        check[f"{weights.kind}_vs_fp"] = report.to_dict()
        check["weights"] = weights.to_dict()
        weight_step.replace_graphs(folder, graphs)
    step("saving the tokenizer")
    tokenizer_info = _save_tokenizer(tokenizer, folder)
    eos_ids = _eos_ids(model, tokenizer)
    files, samples = file_records(folder)
    return Manifest(
        format_version=FORMAT_VERSION,
        role=options.role,
        source=source_info,
        architecture=Architecture(family=source.model_type, **asdict(shape)),
        tokens=Tokens(bos_id=tokenizer.bos_token_id, eos_ids=eos_ids, pad_id=tokenizer.pad_token_id),
        dtype=dtype,
        opset=opset,
        max_context=max_context,
        quantization=weights.kind if weights else None,
        graphs=graphs,
        tokenizer=tokenizer_info,
        files=files,
        samples=samples,
        check=check,
        created={
            "tool": f"jacobi-rt {__version__}",
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **({"graphs_from": str(Path(options.graphs_from).expanduser().resolve())} if options.graphs_from else {}),
        },
    )


def _trace_and_check(
    opened,
    shape,
    folder: Path,
    options: ExportOptions,
    method: str,
    max_context: int,
    step,
    check_progress,
    write_progress,
) -> tuple[dict[str, str], dict]:
    """Trace the portable graph (and the in-place one) into `folder`, their weights in one shared file,
    each checked against PyTorch at shapes inside `max_context` by `method` (budget.check_method)."""
    import torch

    from .checks.check import SHAPES
    from .graph.trace import TracedWeights, export_onnx
    from .weights.weight_file import WeightFile

    model = opened.model
    with WeightFile(folder) as file:

        def weights() -> TracedWeights:  # one per graph: its own progress bar, one shared file
            tensors = sum(1 for _ in model.parameters())
            return TracedWeights.of(model, opened.read, file, write_progress(tensors) if write_progress else None)

        step(f"tracing the window graph ({shape.num_layers} layers, opset {options.opset})")
        graph = folder / GRAPH_FILE
        torch.manual_seed(0)
        step(f"  {export_onnx(model, shape, graph, options.opset, weights())}")
        step(f"checking ONNX against PyTorch at {len(SHAPES)} shapes{' layer by layer' if method == 'layers' else ''}")
        report = _check_portable(opened, shape, graph, options.torch_dtype, method, check_progress, max_context)
        check = {"vs_pytorch": report.to_dict()}
        graphs = {PORTABLE: GRAPH_FILE}
        if options.inplace:  # a second graph, onnxruntime's in-place KV cache (exporter/graph/inplace.py)
            from .attention.gqa_rows import wanted
            from .graph.inplace import add_inplace_graph

            extra, check[INPLACE] = add_inplace_graph(
                model,
                shape,
                folder,
                options.torch_dtype,
                options.opset,
                step,
                check_progress,
                max_context,
                weights(),
                None if method == "full" else graph,
                lambda: _weights_in(opened),
                extra_row=wanted(options.matmul_level),
            )
            graphs.update(extra)
    return graphs, check


def _check_portable(opened, shape, graph: Path, dtype: str, method: str, check_progress, max_context: int):
    """The portable graph against PyTorch: whole (a streamed skeleton filled for it), or layer by layer
    (the parameters outside the decoder layers filled throughout, each layer's read in as it is checked)."""
    from .checks.check import check_against_torch
    from .checks.layer_check import check_layers, outside_layers, stage_count, staged_scope, streamed_layers
    from .graph.skeleton import filled

    model = opened.model
    if method == "full":
        scope = staged_scope(model)
        return check_against_torch(
            model,
            shape,
            graph,
            dtype,
            _progress(check_progress, shape, scope),
            max_context,
            scope,
            weights_in=lambda: _weights_in(opened),
        )
    progress = check_progress(stage_count(shape.num_layers)) if check_progress else None
    if not opened.streamed:
        return check_layers(graph, model, shape, dtype, None, progress, max_context)
    with filled(model, opened.read, outside_layers(model)):
        return check_layers(graph, model, shape, dtype, streamed_layers(model, opened.read), progress, max_context)


def _weights_in(opened):
    """The PyTorch model with its real weights for a check's PyTorch side (a streamed skeleton is filled,
    then emptied before the graph runs: the two never hold the weights at once)."""
    from .graph.skeleton import filled

    return filled(opened.model, opened.read) if opened.streamed else contextlib.nullcontext()


def _check_limits(source, options: ExportOptions) -> None:
    """max_context and keep_layers against what the config says, before the weights load
    (the checks after loading, on the model itself, stay authoritative)."""
    if options.max_context is not None and source.max_positions:
        check_max_context(options.max_context, source.limit)
    if options.keep_layers is not None and source.num_layers:
        check_keep_layers(options.keep_layers, source.num_layers)
    if options.weights == "gguf" and not source.gguf_file:
        raise OptionError(
            f"`weights` gguf keeps a GGUF file's quantized blocks, but {source.name} is not a .gguf; "
            "use `quantize` int4 or int8",
            "weights",
            "quantize",
        )


def keep_first_layers(model, n: int) -> None:
    """Truncate the decoder to its first n layers, in place (config included)."""
    inner = getattr(model, "model", None) or model.transformer
    layers = getattr(inner, "layers", None) or inner.h
    check_keep_layers(n, len(layers))
    del layers[n:]
    model.config.num_hidden_layers = n
    if isinstance(getattr(model.config, "layer_types", None), list):
        model.config.layer_types = model.config.layer_types[:n]


def _progress(factory, shape, scope: str | None):
    """A progress callable for the portable check (its shapes, or its stages), made as the check starts."""
    from .checks.check import SHAPES
    from .checks.staged_run import ticks

    return factory(ticks(len(SHAPES), shape.num_layers, scope is not None)) if factory else None


def _check_destination(out: Path, overwrite: bool) -> None:
    for note in recover_interrupted(out):  # a kill between --overwrite's two renames strands the old artifact
        warnings.warn(note, stacklevel=3)
    if out.exists():
        if not overwrite:
            raise OptionError(
                f"{out} already exists; pass `overwrite` to replace it, or choose another `out`", "overwrite", "out"
            )
        if not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST_NAME).is_file()):
            raise OptionError(
                f"{out} exists and is not a jacobi-rt artifact; refusing to overwrite it, choose another `out`", "out"
            )


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this export created for its parent path (deepest first), if still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _move_into_place(staging: Path, out: Path) -> None:
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)


def _save_tokenizer(tokenizer, folder: Path) -> dict:
    backend = tokenizer.backend_tokenizer
    backend.save(str(folder / "tokenizer.json"))
    template = tokenizer.chat_template if isinstance(getattr(tokenizer, "chat_template", None), str) else None
    if template:
        (folder / "chat_template.jinja").write_text(template)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return {
        "file": "tokenizer.json",
        "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
        "chat_template": "chat_template.jinja" if template else None,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
    }


def _eos_ids(model, tokenizer) -> list[int]:
    ids = []
    generation = getattr(model, "generation_config", None)
    value = getattr(generation, "eos_token_id", None) if generation else None
    for v in (value if isinstance(value, list) else [value]) + [tokenizer.eos_token_id]:
        if isinstance(v, int) and v not in ids:
            ids.append(v)
    return ids


def _peak_rss_mb() -> int | None:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    except (ImportError, OSError):
        return None
