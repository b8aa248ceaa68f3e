"""`python -m benchmarks.op_profile`: onnxruntime's profile of one pass, per op type, on a tiny artifact."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks import op_profile


@pytest.mark.parametrize("graph", ["portable", "inplace"])
def test_profile_counts_every_kernel_of_a_pass(artifact, graph, tmp_path):
    import onnx
    import onnxruntime as ort

    folder = artifact("llama")
    result = op_profile.profile(folder, graph=graph, window=4, past=5, warmup=2, runs=3)
    # the same optimization in a plain session, its optimized graph saved: one kernel per node
    path, _ = op_profile.graph_file(folder, graph)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    nodes = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node
    assert result.nodes == len(nodes)
    assert all(r.nodes == round(r.nodes) for r in result.rows), "a partial run was counted"
    assert result.kernel_ms > 0 and result.pass_ms >= result.kernel_ms


def test_the_table_lists_each_folder(artifact):
    folder = artifact("llama")
    out = CliRunner().invoke(
        op_profile.main, [str(folder), str(folder), "--window", "2", "--past", "3", "--warmup", "1", "--runs", "2"]
    )
    assert out.exit_code == 0, out.output
    header = out.output.splitlines()[1]
    assert header.count("llama/portable ms") == 2
    assert "| all kernels |" in out.output and "| model_run |" in out.output


def test_a_folder_without_a_model_is_refused(tmp_path):
    out = CliRunner().invoke(op_profile.main, [str(tmp_path)])
    assert out.exit_code != 0 and "neither a jacobi.json nor a model.onnx" in out.output
