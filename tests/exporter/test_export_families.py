"""The families beyond the first six (tiny_models.MORE_FAMILIES, each shrunk from the real checkpoint
named there): one export per family, both graphs matched against PyTorch by the export's own check,
the portable graph against the model's own forward, greedy generation equal to transformers', and
every strategy equal to greedy."""

from __future__ import annotations

import numpy as np
import pytest
from export_helpers import assert_generation_is_greedy, assert_greedy_equal, hf_case, run
from tiny_models import MORE_FAMILIES

PROMPT = [5, 17, 33, 90, 5, 17, 33]


@pytest.fixture(scope="module", params=sorted(MORE_FAMILIES))
def family(request, tiny_artifact):
    """Each family, exported once (the session's tiny_artifact)."""
    return tiny_artifact(request.param)


def test_both_graphs_pass_the_exports_check(family):
    manifest = family.manifest
    assert manifest.architecture.family == family.family
    assert manifest.graphs == {"portable": "model.onnx", "inplace": "model-inplace.onnx"}
    for name in ("vs_pytorch", "inplace"):
        check = manifest.check[name]
        assert check["agreement"] == 1.0 and check["max_logit_diff"] <= check["tolerance"], name
    windows = {s["window"] for s in manifest.check["inplace"]["shapes"]}
    assert {1, 8, 16} <= windows and max(s["past"] for s in manifest.check["inplace"]["shapes"]) >= 33


@pytest.mark.parametrize("batch,window,past,pad", [(1, 1, 7, False), (2, 6, 5, True)])
def test_portable_graph_matches_the_models_own_forward(family, hf_model, ort_session, batch, window, past, pad):
    model = hf_model(family.model_dir)
    case = hf_case(model, batch, window, past, seed=11 * window + past, pad_row=pad)
    out = run(ort_session(family.artifact), case.feeds)
    np.testing.assert_allclose(out["logits"], case.logits, atol=1e-4, rtol=1e-4)
    assert_greedy_equal(out["greedy_ids"], case.logits)


def test_generation_equals_transformers_greedy_under_every_strategy(family, hf_model):
    greedy = assert_generation_is_greedy(family.artifact, hf_model(family.model_dir), PROMPT, 24)
    assert len(set(greedy)) > 1  # not one token repeated, which a wrong graph could also produce


def test_an_int8_export_runs_and_every_strategy_equals_its_greedy(family, tmp_path):
    """`quantize` int8 on the checked graphs (graphs_from: only the weight pass runs)."""
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime import Generator

    manifest = export(
        str(family.model_dir), tmp_path / "int8", ExportOptions(quantize="int8", graphs_from=str(family.artifact))
    )
    assert manifest.quantization == "int8" and set(manifest.graphs) == {"portable", "inplace"}
    assert manifest.check["int8_vs_fp"]["agreement"] > 0.5
    generator = Generator.load(tmp_path / "int8", threads=1)
    greedy = generator.generate(PROMPT, max_new_tokens=16, strategy="greedy").ids
    for strategy in ("jacobi", "lookahead"):
        assert generator.generate(PROMPT, max_new_tokens=16, strategy=strategy).ids == greedy, strategy
