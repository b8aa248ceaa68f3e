"""The streamed weight pass: the graphs of the in-memory pass it replaced, one weights file for both
graphs of an artifact, a GGUF matched tensor by tensor, and memory bounded by a few tensors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from tiny_models import FAMILIES, STITCHED
from weight_golden import CASES, DATA, describe, export_case, kernels

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory, tiny_artifact) -> tuple[str, Path, Path]:
    """(case, its weight variant's folder, the float artifact it was made from). A case on a tiny model
    CI exports ("llama", "llama-mha-tied", "llama-5layers") starts from the session's float artifact of it (CI's
    prebuilt one), not an export of its own: the same model and options, which the recorded float digests check."""
    root = tmp_path_factory.mktemp(request.param)
    source = CASES[request.param][0]
    base = None
    if source in FAMILIES or source in STITCHED:
        exported = tiny_artifact(source)
        base = (exported.model_dir, exported.artifact)
    folder, float_folder = export_case(request.param, root, base)
    return request.param, folder, float_folder


def test_the_pass_makes_the_graphs_it_made_before(case):
    """Node for node, initializer for initializer (values wherever stored), outputs bit for bit and
    generated tokens: what the in-memory pass wrote (weight_golden.py recorded it before the change)."""
    name, folder, float_folder = case
    want = json.loads((DATA / f"{name}.json").read_text())
    got = describe(folder, float_folder)
    assert got["float"] == want["float"], (
        "the float export itself changed: these digests no longer test the weight pass"
    )
    assert got["graphs"] == want["graphs"]
    if kernels() not in want["outputs"]:  # equal graphs; their outputs round by instruction set (weight_golden.py)
        pytest.skip(
            f"the graphs are equal; no outputs are recorded for this CPU's kernels ({kernels()}; recorded: "
            f"{sorted(want['outputs'])}): python tests/exporter/weight_golden.py --outputs records them"
        )
    assert got["outputs"] == want["outputs"][kernels()]
    assert got["tokens"] == want["tokens"][kernels()]


def external(path: Path) -> dict[str, tuple[str, int, int]]:
    """initializer -> (location, offset, length) of a graph file's external tensors."""
    model = onnx.load(str(path), load_external_data=False)
    out = {}
    for init in model.graph.initializer:
        info = {e.key: e.value for e in init.external_data}
        if info:
            out[init.name] = (info["location"], int(info.get("offset", 0)), int(info["length"]))
    return out


def test_both_graphs_read_one_weights_file_holding_one_copy(case):
    from jacobi_rt.runtime.manifest import load_manifest

    name, folder, _ = case
    manifest = load_manifest(folder, verify=True)
    portable, inplace = (external(folder / manifest.graphs[role]) for role in ("portable", "inplace"))
    assert {loc for loc, _, _ in [*portable.values(), *inplace.values()]} == {"weights.data"}
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".data") == ["weights.data"]
    assert (
        "weights.data" in manifest.files
        and manifest.check["weights"]["graph_bytes"]["weights.data"] == (folder / "weights.data").stat().st_size
    )
    portable_bytes = sum(length for _, _, length in portable.values())
    size = (folder / "weights.data").stat().st_size
    assert size < 1.1 * portable_bytes, (
        size,
        portable_bytes,
    )  # alignment padding and the in-place graph's few own tensors
    shared = {(offset, length) for _, offset, length in portable.values()}
    inplace_bytes = sum(length for _, _, length in inplace.values())
    own = sum(length for _, offset, length in inplace.values() if (offset, length) not in shared)
    assert own < 0.05 * inplace_bytes, (name, own, inplace_bytes)  # packed q|k|v = the stacked siblings' bytes


def test_a_legacy_float_artifact_with_a_data_file_per_graph(tiny_artifact, tmp_path):
    """Float graphs whose weights are in model.onnx.data and model-inplace.onnx.data (as a model over
    2 GB was exported before weights.data): `graphs_from` copies both and verifies them, the pass reads them, and the
    variant has one weights.data, its graphs equal to those made from an artifact with inline weights.
    Both bases are the session's float artifact of the tiny llama (read only; the legacy one a copy rewritten)."""
    from weight_golden import graph_digests, to_legacy_layout

    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.manifest import load_manifest

    base = tiny_artifact("llama")
    model = str(base.model_dir)
    shutil.copytree(base.artifact, tmp_path / "legacy")
    to_legacy_layout(tmp_path / "legacy")
    load_manifest(tmp_path / "legacy", verify="full")
    assert sorted(p.name for p in (tmp_path / "legacy").glob("*.data")) == [
        "model-inplace.onnx.data",
        "model.onnx.data",
    ]
    for name, folder in (("inline", base.artifact), ("legacy", tmp_path / "legacy")):
        export(model, tmp_path / f"int4-{name}", ExportOptions(quantize="int4", graphs_from=str(folder)))
    out = tmp_path / "int4-legacy"
    assert sorted(p.name for p in out.glob("*.data")) == ["weights.data"] and not list(out.glob(".*"))
    for graph in ("model.onnx", "model-inplace.onnx"):
        assert graph_digests(out / graph) == graph_digests(tmp_path / "int4-inline" / graph), graph
    assert (
        Generator.load(out).generate([5, 17, 33], max_new_tokens=4).ids
        == Generator.load(tmp_path / "int4-inline").generate([5, 17, 33], max_new_tokens=4).ids
    )


def test_a_changed_data_file_of_the_base_is_refused(tiny_artifact, tmp_path):
    from weight_golden import to_legacy_layout

    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime.errors import ArtifactError

    base = tiny_artifact("llama")  # a copy of the session's float artifact, rewritten in the legacy layout
    model = str(base.model_dir)
    shutil.copytree(base.artifact, tmp_path / "legacy")
    to_legacy_layout(tmp_path / "legacy")
    with open(tmp_path / "legacy" / "model.onnx.data", "r+b") as f:
        f.write(b"\1\2\3\4")
    with pytest.raises(ArtifactError, match=r"model\.onnx\.data was changed after export"):
        export(model, tmp_path / "out", ExportOptions(quantize="int8", graphs_from=str(tmp_path / "legacy")))
    assert not (tmp_path / "out").exists()


def test_gguf_tensors_are_dequantized_once_each_however_many_share_a_shape(tmp_path, monkeypatch):
    """8 layers of like-shaped tensors, each candidate's rows in a random order: every tensor is found
    with its order, and the gguf package dequantizes each tensor once (a quadratic search would
    dequantize every tensor of a shape for every candidate of that shape)."""
    gguf_quants = pytest.importorskip(
        "gguf.quants", reason="GGUF sources need the `gguf` package: pip install 'jacobi-rt[export]'"
    )
    import tiny_gguf

    from jacobi_rt.exporter.weights.gguf_weights import Candidate, GgufWeights

    monkeypatch.setattr(tiny_gguf, "LAYERS", 8)
    path = tiny_gguf.write_tiny_gguf(tmp_path / "deep.gguf", "Q4_1")
    weights = GgufWeights(path)
    rng = np.random.default_rng(0)
    expected, candidates = {}, []
    for tensor in weights.tensors:
        values = gguf_quants.dequantize(tensor.raw, gguf_quants.GGMLQuantizationType[tensor.kind]).reshape(tensor.shape)
        order = rng.permutation(tensor.shape[0])
        expected[tensor.name] = (tensor, order)
        candidates.append(Candidate(tensor.name, tensor.shape, lambda w=values[order].copy(): w))  # noqa: B008 - binds this tensor
    calls = []
    real = gguf_quants.dequantize
    monkeypatch.setattr(gguf_quants, "dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = weights.plan(candidates)
    assert len(weights.tensors) == 8 * 7 + 2 and len(calls) == len(weights.tensors)
    assert set(plan.matrices) == set(expected) and plan.tensor_types() == {"Q4_1": len(expected)}
    for name, (tensor, order) in expected.items():
        made, alone = plan.matrices[name].make(), tensor.blocks().take_rows(order)
        assert np.array_equal(made.q, alone.q) and np.array_equal(made.scales, alone.scales), name


MEMORY_CHILD = r"""
import json, re, sys
from pathlib import Path
import psutil, onnx, onnxruntime  # imported before the baseline: the growth is the pass's data
from jacobi_rt.exporter.options import ExportOptions
from jacobi_rt.exporter.weights import weight_step
folder = Path(sys.argv[1])
graphs = json.loads((folder / "jacobi.json").read_text())["graphs"]
before = psutil.Process().memory_info().rss
report = weight_step.quantize_graphs(
    folder, graphs, None, ExportOptions(quantize="int4"), lambda line: None, max_positions=int(sys.argv[2])
)
# VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's peak (getrusage(2): kept across execve)
peak = int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
print(json.dumps({"before": before, "peak": peak, "weights": report.graph_bytes["weights.data"]}))
"""


@pytest.mark.slow
def test_quantizing_a_mid_size_graph_holds_a_few_tensors(artifact, tmp_path):
    """SmolLM2-135M's float artifact (540 MB of float32 weights in weights.data, CI's prebuilt one; a copy,
    since the pass stages its files in the folder) through the int4 pass in a fresh process: its peak RSS
    grows by under 0.5x the float weights (the in-memory pass: 3x)."""
    from make_artifacts import SMOLLM2

    from jacobi_rt.runtime.manifest import load_manifest

    source = artifact(SMOLLM2)
    manifest = load_manifest(source)
    folder = tmp_path / "float"
    folder.mkdir()
    for name in ("jacobi.json", *dict.fromkeys(manifest.graphs.values()), "weights.data"):
        shutil.copyfile(source / name, folder / name)
    floats = (folder / "weights.data").stat().st_size
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(folder), str(manifest.architecture.max_positions)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    growth = figures["peak"] - figures["before"]
    print(
        f"peak RSS growth {growth / 2**20:.0f} MiB for {floats / 2**20:.0f} MiB of float32 weights "
        f"({growth / floats:.2f}x)"
    )
    assert growth < 0.5 * floats, figures
    arch = manifest.architecture
    embedding = arch.vocab_size * arch.hidden_size * 4  # the Gather's table stays float32
    # int4 blocks and scales, stored once: every matrix (the tied LM head too, from the table) at under 0.2x
    assert figures["weights"] < embedding + 0.2 * floats, (figures, embedding, floats)
