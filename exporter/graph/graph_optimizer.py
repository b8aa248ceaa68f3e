"""onnxscript's optimizer, as torch.onnx.export(optimize=True) runs it, with only the rewrite rules that fire.

onnxscript tries each of its 46 default rewrite rules at every node, in each of two rounds: 22 of
the 24 CPU seconds its optimizer took on a 30-layer Llama graph (5,452 nodes), though only one or
two rules ever matched. A stitched graph's layers are copies of traced ones (stitch.py), so the
rules that fire on the small traced graph are the rules that can fire on the whole: they are
found there (each rule on its own, on a copy, rounds until none fires), and the whole graph then
goes through onnxscript's own passes in their order with those rules alone. A graph that came
out different would compute the same (every rule preserves what the graph computes) and still
be checked against PyTorch; tests/exporter/test_export_stitch.py checks that it comes out equal.
Where onnxscript's internals differ from these (another version), its plain optimizer runs.
"""

from __future__ import annotations

ROUNDS = 2  # optimize_ir's num_iterations


def _default(node):
    return None  # onnxscript's own folding rules for every node


def _folding(constant_folding):
    """onnxscript's constant folding pass, with the settings its optimize_ir uses."""
    return constant_folding.FoldConstantsPass(
        shape_inference=True,
        input_size_limit=constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        should_fold=_default,
    )


def _internals():
    """onnxscript's pass pieces, or None where this onnxscript lacks them."""
    try:
        import onnx_ir.passes.common as common_passes
        import onnxscript.rewriter.onnx_fusions as onnx_fusions
        from onnxscript import rewriter
        from onnxscript.optimizer import _constant_folding
        from onnxscript.rewriter import pattern
    except ImportError:
        return None
    if not hasattr(rewriter, "_DEFAULT_REWRITE_RULES") or not hasattr(_constant_folding, "FoldConstantsPass"):
        return None
    return common_passes, onnx_fusions, rewriter, _constant_folding, pattern


def rules_that_fire(model) -> list | None:
    """The default rewrite rules that rewrite something in (a copy of) `model`, or None where
    onnxscript's internals are not the ones this module knows."""
    parts = _internals()
    if parts is None:
        return None
    _, _, rewriter, constant_folding, pattern = parts
    copy = model.clone()
    fired = []
    for _ in range(1 + ROUNDS):  # a rule may only match after another fired
        _folding(constant_folding)(copy)
        new = [
            rule
            for rule in rewriter._DEFAULT_REWRITE_RULES
            if rule not in fired and pattern.RewriteRuleSet([rule]).apply_to_model(copy)
        ]
        if not new:
            break
        fired += new
    return [rule for rule in rewriter._DEFAULT_REWRITE_RULES if rule in fired]  # onnxscript's order


def optimize(model, rules: list | None) -> None:
    """onnxscript's optimize_ir and onnx fusions (torch's `ONNXProgram.optimize`) on `model`, in place,
    with `rules` for its rewrite pass (None: onnxscript's own optimizer, all rules)."""
    parts = _internals()
    if rules is None or parts is None:
        from torch.onnx._internal._lazy_import import onnxscript_apis

        onnxscript_apis.optimize(model)
        return
    import onnx_ir as ir

    common_passes, onnx_fusions, rewriter, constant_folding, _ = parts
    step = [_folding(constant_folding)]
    if rules:
        step.append(rewriter.RewritePass(rules))
    step += [
        common_passes.RemoveUnusedNodesPass(),
        common_passes.RemoveUnusedFunctionsPass(),
        common_passes.RemoveUnusedOpsetsPass(),
    ]
    ir.passes.Sequential(
        common_passes.InlinePass(),
        ir.passes.PassManager(step, steps=ROUNDS, early_stop=True),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )(model)
    onnx_fusions.fuse(model)
