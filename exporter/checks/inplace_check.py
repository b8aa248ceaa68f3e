"""The in-place graph's export check: onnxruntime against the portable PyTorch window model, or,
for a model too big for that (the portable graph checked layer by layer), against the portable ONNX
graph, both run stage by stage (staged_run.py).

Each case is a batch of rows with their own cached lengths (a real past from a forward of the
reference, the buffer's unused tail filled with noise that must never be read), one window per row,
and a two-branch window mask for windows of 4 and more. Every row is compared with the reference
run on that row alone, so the check covers the contrib op, the bias built in-graph and the per-row
lengths at once.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from jacobi_rt.runtime.errors import ExportCheckError

from ..graph.trace import ModelShape
from ..graph.window_model import WindowModel, output_cache
from .check import TOLERANCE, CheckReport, _compare
from .staged_run import Run, run_graph, run_staged

# (lengths of the rows, window)
CASES = [((0,), 1), ((0,), 4), ((9,), 1), ((17,), 8), ((6, 3), 5), ((0, 7), 3), ((33, 20), 16)]
SLACK = 3  # capacity beyond the longest row: a tail the graph must not read


def _row_case(model, shape, length: int, window: int, generator) -> dict:
    """One row: its past (real), its window, positions and mask (a second branch when window >= 4)."""
    dtype = next(model.parameters()).dtype
    ids = torch.randint(0, shape.vocab_size, (1, length + window), generator=generator)
    if length:
        with torch.no_grad():
            out = model(ids[:, :length], use_cache=True)
        kv = [t for layer in output_cache(out).layers for t in (layer.keys, layer.values)]
    else:
        kv = [torch.zeros(1, shape.kv_heads, 0, shape.head_dim, dtype=dtype) for _ in range(2 * shape.num_layers)]
    mask, positions = (torch.from_numpy(a) for a in _branched_window(length, window))
    return {"ids": ids[:, length:], "positions": positions, "mask": mask, "kv": kv, "length": length}


def _branched_window(length: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's window mask [1, W, W] and positions [1, W] after `length` cached tokens: causal, and for
    windows of 4 and more the second half an independent branch from the same place."""
    mask = np.tril(np.ones((window, window), dtype=bool))[None]
    positions = np.arange(length, length + window, dtype=np.int64)[None]
    if window >= 4:
        half = window // 2
        mask[:, half:, :half] = False
        positions[:, half:] = positions[:, : window - half]
    return mask, positions


def _portable_row(wrapper, row: dict, window: int) -> list:
    """The portable PyTorch window model's outputs for one row alone (numpy, float32)."""
    with torch.no_grad():
        out = wrapper(
            row["ids"],
            row["positions"],
            torch.ones(1, row["length"] + window, dtype=torch.long),
            row["mask"],
            *row["kv"],
        )
    return [t.float().numpy() for t in out]


def inplace_feeds(rows: list[dict], shape, capacity: int, generator) -> dict:
    """The in-place graph's inputs for a batch of rows (numpy)."""
    dtype = rows[0]["kv"][0].dtype
    window = rows[0]["ids"].shape[1]
    total = max(r["length"] for r in rows) + window
    feeds = {
        "input_ids": torch.cat([r["ids"] for r in rows]),
        "position_ids": torch.cat([r["positions"] for r in rows]),
        "attention_mask": torch.ones(len(rows), total, dtype=torch.long),
        "window_mask": torch.cat([r["mask"] for r in rows]),
        "cache_lengths": torch.tensor([r["length"] for r in rows]),
    }
    for i in range(2 * shape.num_layers):
        buffer = torch.randn(len(rows), shape.kv_heads, capacity, shape.head_dim, generator=generator).to(dtype) * 100
        for b, r in enumerate(rows):
            buffer[b, :, : r["length"]] = r["kv"][i][0]
        name = f"past_key_values.{i // 2}.{'value' if i % 2 else 'key'}"
        feeds[name] = buffer
    return {k: v.numpy() for k, v in feeds.items()}


def fitted_cases(cases: list, limit: int | None) -> list:
    """Cases whose rows fit `limit` positions (the exported context), windows and lengths shrunk."""
    if limit is None:
        return list(cases)
    return [
        (tuple(min(length, limit - min(window, limit)) for length in lengths), min(window, limit))
        for lengths, window in cases
    ]


def check_inplace_against_torch(
    model,
    shape,
    onnx_path,
    dtype: str,
    progress=None,
    cases=CASES,
    max_context: int | None = None,
    layer_scope: str | None = None,
    weights_in=contextlib.nullcontext,
) -> CheckReport:
    """Compare the in-place ONNX with the portable PyTorch window model row by row; raise if out of tolerance.

    cases: (lengths of the rows, window) per batch, fitted into max_context (the exported context).
    layer_scope, weights_in: as check.check_against_torch's (the graph stage by stage; PyTorch's side
    first, within weights_in(), then the graph)."""
    wrapper = WindowModel(model, shape.num_layers).eval()
    report = CheckReport(tolerance=TOLERANCE[dtype])
    batches, runs, expected = [], [], []
    with weights_in():
        for seed, (lengths, window) in enumerate(fitted_cases(cases, max_context)):
            g = torch.Generator().manual_seed(100 + seed)
            rows = [_row_case(model, shape, length, window, g) for length in lengths]
            feeds = inplace_feeds(rows, shape, max(lengths) + window + SLACK, g)
            past = {
                j: (feeds.pop(f"past_key_values.{j}.key"), feeds.pop(f"past_key_values.{j}.value"))
                for j in range(shape.num_layers)
            }
            batches.append(rows)
            runs.append(Run(feeds, past=past))
            expected.append([_portable_row(wrapper, r, window) for r in rows])
    names = run_graph(onnx_path, shape, runs, layer_scope, progress)
    for rows, run, references in zip(batches, runs, expected):
        got = run.ordered(names)
        window = rows[0]["ids"].shape[1]
        for b, (r, reference) in enumerate(zip(rows, references)):
            total = r["length"] + window
            mine = [got[0][b : b + 1], got[1][b : b + 1], *(p[b : b + 1, :, :total] for p in got[2:])]
            _compare(report, reference, mine, (len(rows), window, r["length"]))
    _verdict(report, onnx_path)
    return report


def check_inplace_against_portable(
    portable_path,
    onnx_path,
    shape: ModelShape,
    dtype: str,
    layer_scope: str,
    progress=None,
    cases=CASES,
    max_context: int | None = None,
) -> CheckReport:
    """Compare the in-place ONNX with the portable ONNX (checked against PyTorch already), row by row,
    both run stage by stage: one layer's weights resident at a time (progress: ticked per stage of
    either graph). Each row's past is the portable graph's own over random tokens; raise if out of tolerance."""
    rng = np.random.default_rng(100)
    batches = [
        [_onnx_row(shape, length, window, rng) for length in lengths]
        for lengths, window in fitted_cases(cases, max_context)
    ]
    names = run_staged(portable_path, shape, layer_scope, [row for rows in batches for row in rows], progress)
    batched = [_inplace_run(rows, shape, np.dtype(dtype), rng) for rows in batches]
    run_staged(onnx_path, shape, layer_scope, batched, progress)
    report = CheckReport(tolerance=TOLERANCE[dtype], reference="portable onnx", method="layer by layer")
    for rows, run in zip(batches, batched):
        window = rows[0].feeds["input_ids"].shape[1]
        for b, row in enumerate(rows):
            total = row.feeds["attention_mask"].shape[1]
            mine = [
                run.outputs[n][b : b + 1] if n in ("logits", "greedy_ids") else run.outputs[n][b : b + 1, :, :total]
                for n in names
            ]
            _compare(report, row.ordered(names), mine, (len(rows), window, total - window))
    _verdict(report, onnx_path)
    return report


def _onnx_row(shape: ModelShape, length: int, window: int, rng) -> Run:
    """One row for the portable graph: a window (a second branch when window >= 4) over `length` past
    tokens, their past computed by the graph itself (the prefill)."""
    ids = rng.integers(0, shape.vocab_size, (1, length + window))
    mask, positions = _branched_window(length, window)
    prefill = None
    if length:
        prefill = Run(
            {
                "input_ids": ids[:, :length],
                "position_ids": np.arange(length)[None],
                "attention_mask": np.ones((1, length), dtype=np.int64),
                "window_mask": np.tril(np.ones((length, length), dtype=bool))[None],
            }
        )
    return Run(
        {
            "input_ids": ids[:, length:],
            "position_ids": positions,
            "attention_mask": np.ones((1, length + window), dtype=np.int64),
            "window_mask": mask,
        },
        prefill,
    )


def _inplace_run(rows: list[Run], shape: ModelShape, dtype: np.dtype, rng) -> Run:
    """The rows as one batch of the in-place graph: each row's past in a buffer of the batch's capacity,
    its unused tail noise."""
    window = rows[0].feeds["input_ids"].shape[1]
    lengths = [row.feeds["attention_mask"].shape[1] - window for row in rows]
    capacity = max(lengths) + window + SLACK
    past = {}
    for j in range(shape.num_layers):
        buffers = []
        for kv in (0, 1):
            buffer = (rng.standard_normal((len(rows), shape.kv_heads, capacity, shape.head_dim)) * 100).astype(dtype)
            for b, (row, length) in enumerate(zip(rows, lengths)):
                buffer[b, :, :length] = row.past_of(j, shape)[kv][0]
            buffers.append(buffer)
        past[j] = tuple(buffers)
    feeds = {
        name: np.concatenate([row.feeds[name] for row in rows]) for name in ("input_ids", "position_ids", "window_mask")
    }
    feeds["attention_mask"] = np.ones((len(rows), max(lengths) + window), dtype=np.int64)
    feeds["cache_lengths"] = np.array(lengths, dtype=np.int64)
    return Run(feeds, past=past)


def _verdict(report: CheckReport, onnx_path) -> None:
    if (
        report.max_logit_diff > report.tolerance
        or report.max_present_diff > report.tolerance
        or report.greedy_agree + report.near_ties < report.positions
    ):
        raise ExportCheckError(
            f"{onnx_path}: the in-place graph disagrees with {report.reference}: "
            f"max |logit diff| {report.max_logit_diff:.3g}, "
            f"max |cache diff| {report.max_present_diff:.3g} (tolerance {report.tolerance:g}), greedy ids agree on "
            f"{report.greedy_agree}/{report.positions} positions ({report.near_ties} near-ties); "
            f"per row: {report.shapes}. "
            "This is an exporter bug for this model: please report it"
        )
