"""The export check: run the ONNX in onnxruntime against PyTorch on random windows.

Shapes cover window 1 and past 0, batch 2 with a padded prefix, and a two-branch window mask.
The past comes from a real PyTorch forward over random tokens, so the cache is realistic.
A greedy-id mismatch fails the check unless PyTorch itself saw a near-tie there.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from jacobi_rt.runtime.errors import ExportCheckError

from ..graph.trace import ModelShape
from ..graph.window_model import WindowModel, output_cache
from .staged_run import Run, run_graph, ticks

# (batch, window, past)
SHAPES = [(1, 1, 0), (1, 4, 0), (1, 1, 9), (1, 8, 17), (2, 5, 6), (2, 16, 33)]
TOLERANCE = {"float32": 2e-3, "float16": 5e-2}


def fitted(shapes: list, limit: int | None) -> list:
    """(batch, window, past) shapes shrunk to fit `limit` positions (the exported context: a
    sliding window can be shorter than the check's longest past)."""
    if limit is None:
        return list(shapes)
    return [(batch, min(window, limit), min(past, limit - min(window, limit))) for batch, window, past in shapes]


@dataclass
class CheckReport:
    shapes: list = field(default_factory=list)
    max_logit_diff: float = 0.0
    max_present_diff: float = 0.0
    positions: int = 0
    greedy_agree: int = 0
    near_ties: int = 0
    tolerance: float = 0.0
    reference: str = "pytorch"
    text_agreement: float | None = None  # quantized vs unquantized on natural text
    method: str = "full"  # the whole graph against the whole model (layer_check.py: "layer by layer")

    @property
    def agreement(self) -> float:
        return self.greedy_agree / max(self.positions, 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "agreement": round(self.agreement, 6)}


def case_tensors(vocab_size: int, batch: int, window: int, past: int, seed: int) -> tuple:
    """One check case's tokens and masks: ids [B, P + W] (the past's, then the window's), attention
    mask [B, P + W] (row 1 left-padded when there are two), window mask [B, W, W] and positions [B, W]
    (for windows of 4 and more, the second half is a branch from the same place as the first)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, past + window), generator=g)
    mask = torch.ones(batch, past + window, dtype=torch.long)
    if batch > 1 and past > 2:
        mask[1, :2] = 0
    window_mask = torch.tril(torch.ones(window, window, dtype=torch.bool)).repeat(batch, 1, 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    if window >= 4:
        half = window // 2
        window_mask[:, half:, :half] = False
        positions[:, half:] = positions[:, : window - half]
    return ids, mask, window_mask, positions


def random_case(model, shape: ModelShape, batch: int, window: int, past: int, seed: int) -> list:
    """Contract inputs (torch) for one random window over a real past."""
    ids, mask, window_mask, positions = case_tensors(shape.vocab_size, batch, window, past, seed)
    dtype = next(model.parameters()).dtype
    if past:
        with torch.no_grad():
            out = model(ids[:, :past], attention_mask=mask[:, :past], use_cache=True)
        kv = [t for layer in output_cache(out).layers for t in (layer.keys, layer.values)]
    else:
        kv = [torch.zeros(batch, shape.kv_heads, 0, shape.head_dim, dtype=dtype) for _ in range(2 * shape.num_layers)]
    return [ids[:, past:], positions, mask, window_mask, *kv]


def check_against_torch(
    model,
    shape: ModelShape,
    onnx_path,
    dtype: str,
    progress=None,
    max_context: int | None = None,
    layer_scope: str | None = None,
    weights_in=contextlib.nullcontext,
) -> CheckReport:
    """Compare ONNX (onnxruntime, CPU) with the PyTorch window model; raise ExportCheckError if out of tolerance.
    max_context: the exported context; the shapes are fitted into it. layer_scope: the graph runs stage
    by stage (staged_run.py), one layer's weights resident; progress ticks per stage then.
    weights_in(): a context within which the model holds its weights (a streamed skeleton filled): PyTorch's
    side runs in it, the graph after it, so the two never hold the weights at once."""
    wrapper = WindowModel(model, shape.num_layers).eval()
    report = CheckReport(tolerance=TOLERANCE[dtype])
    shapes, runs, expected = fitted(SHAPES, max_context), [], []
    with weights_in():
        for seed, (batch, window, past) in enumerate(shapes):
            inputs = random_case(model, shape, batch, window, past, seed)
            with torch.no_grad():
                expected.append([t.float().numpy() for t in wrapper(*inputs)])
            ids, positions, mask, window_mask, *kv = [t.numpy() for t in inputs]
            runs.append(
                Run(
                    {"input_ids": ids, "position_ids": positions, "attention_mask": mask, "window_mask": window_mask},
                    past={j: (kv[2 * j], kv[2 * j + 1]) for j in range(shape.num_layers)},
                )
            )
    names = run_graph(onnx_path, shape, runs, layer_scope, progress)
    for case, reference, run in zip(shapes, expected, runs):
        _compare(report, reference, run.ordered(names), case)
    if report.max_logit_diff > report.tolerance or report.greedy_agree + report.near_ties < report.positions:
        raise ExportCheckError(
            f"{onnx_path}: ONNX disagrees with PyTorch: max |logit diff| {report.max_logit_diff:.3g} "
            f"(tolerance {report.tolerance:g}), greedy ids agree on {report.greedy_agree}/{report.positions} positions "
            f"({report.near_ties} near-ties); per shape: {report.shapes}. "
            "This is an exporter bug for this model: please report it"
        )
    return report


def _compare(report: CheckReport, expected: list, got: list, shape: tuple) -> None:
    logit_diff = float(np.abs(expected[0] - got[0]).max())
    present_diff = max(
        (float(np.abs(e - g.astype(np.float32)).max()) for e, g in zip(expected[2:], got[2:]) if e.size), default=0.0
    )
    same = expected[1] == got[1]
    top2 = np.sort(expected[0], axis=-1)[..., -2:]
    tie = (top2[..., 1] - top2[..., 0]) <= 2 * report.tolerance
    report.positions += same.size
    report.greedy_agree += int(same.sum())
    report.near_ties += int((~same & tie).sum())
    report.max_logit_diff = max(report.max_logit_diff, logit_diff)
    report.max_present_diff = max(report.max_present_diff, present_diff)
    report.shapes.append({"batch": shape[0], "window": shape[1], "past": shape[2], "max_logit_diff": logit_diff})


def check_against_onnx(
    reference_path,
    quantized_path,
    shape: ModelShape,
    text_ids: list[int],
    progress=None,
    max_context: int | None = None,
    layer_scope: str | None = None,
) -> CheckReport:
    """A quantized graph is compared with the unquantized ONNX: agreement is reported, not enforced.

    The cases are random_case's, their past from the unquantized graph itself (checked against PyTorch
    already), so no PyTorch model is held: the float graph's and the quantized one's sessions, whole,
    or with `layer_scope` (the decoder layers' module scope, e.g. "model.model.layers.") stage by
    stage (staged_run.py), one layer's weights resident at a time, for float graphs too big for memory.
    Besides the random windows, `text_ids` (tokenized natural text) is run as one prefill window;
    its agreement (`text_agreement`) is the figure that predicts generation quality.
    """
    shapes = fitted(SHAPES, max_context)
    runs = [_onnx_run(shape, *case, seed) for seed, case in enumerate(shapes)] + [_text_run(text_ids)]
    quantized = [Run(run.feeds) for run in runs]
    names = run_graph(reference_path, shape, runs, layer_scope, progress)
    for run, twin in zip(runs, quantized):
        twin.past = {j: run.past_of(j, shape) for j in range(shape.num_layers)}
    run_graph(quantized_path, shape, quantized, layer_scope, progress)
    report = CheckReport(
        tolerance=float("inf"), reference="unquantized onnx", method="full" if layer_scope is None else "layer by layer"
    )
    for case, run, twin in zip(shapes, runs, quantized):
        _compare(report, run.ordered(names), twin.ordered(names), case)
    report.text_agreement = float((runs[-1].outputs["greedy_ids"] == quantized[-1].outputs["greedy_ids"]).mean())
    return report


def agreement_steps(num_layers: int, staged: bool) -> int:
    """The ticks check_against_onnx gives its progress: each stage of both graphs, or each run (the
    random cases and the text) of both."""
    return 2 * ticks(len(SHAPES) + 1, num_layers, staged)


def _onnx_run(shape: ModelShape, batch: int, window: int, past: int, seed: int) -> Run:
    """random_case's inputs (numpy), the past to come from the graph run over the past tokens as one
    window (positions from 0, as random_case's PyTorch forward gives them)."""
    ids, mask, window_mask, positions = case_tensors(shape.vocab_size, batch, window, past, seed)
    prefill = None
    if past:
        prefill = Run(
            {
                "input_ids": ids[:, :past].numpy(),
                "position_ids": np.arange(past, dtype=np.int64)[None].repeat(batch, 0),
                "attention_mask": mask[:, :past].numpy(),
                "window_mask": np.tril(np.ones((past, past), dtype=bool))[None].repeat(batch, 0),
            }
        )
    return Run(
        {
            "input_ids": ids[:, past:].numpy(),
            "position_ids": positions.numpy(),
            "attention_mask": mask.numpy(),
            "window_mask": window_mask.numpy(),
        },
        prefill,
    )


def _text_run(text_ids: list[int]) -> Run:
    n = len(text_ids)
    return Run(
        {
            "input_ids": np.array([text_ids], dtype=np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None],
            "attention_mask": np.ones((1, n), dtype=np.int64),
            "window_mask": np.tril(np.ones((n, n), dtype=bool))[None],
        }
    )
