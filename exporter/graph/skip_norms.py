"""Residual Add + RMSNorm -> `com.microsoft.SkipSimplifiedLayerNormalization`, in onnxruntime-only graphs.

onnxruntime fuses the traced RMSNorm into SimplifiedLayerNormalization by itself (norms.py), but
its SkipLayerNormFusion only takes LayerNormalization, so the residual Add before each norm stays
a node of its own (60 on SmolLM2). Graphs that already hold contrib ops (the weight pass's
MatMulNBits) get the fused node written directly: the norm's output and, as its fourth output,
the sum that the next residual Add reads; so does the in-place graph (GroupQueryAttention), in the
trace's own load and save, so its check against PyTorch covers the fused node. The portable float graph
keeps the standard ops.
"""

from __future__ import annotations

from collections import defaultdict

MS_DOMAIN = "com.microsoft"


def fuse_skip_norms(model) -> int:
    """Rewrite every `Add(a, b) -> Pow/ReduceMean/Add/Sqrt/Div/Mul(w)` (norms.py's pattern) in place;
    return how many were fused."""
    from onnx import helper, numpy_helper

    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in graph.value_info}
    fused, removed = {}, set()
    for node in graph.node:
        norm = _norm_after(node, producer, consumers, constants) if node.op_type == "Pow" else None
        if norm is not None and ranks.get(node.input[0]) != 3:  # the kernel's input is [batch, sequence, hidden]
            norm = None
        if norm is None:
            continue
        add, chain, weight, epsilon = norm
        rest = [c for c in consumers[add.output[0]] if c is not chain[0] and c is not chain[4]]
        outputs = [chain[-1].output[0], "", "", add.output[0]] if rest else [chain[-1].output[0]]
        fused[id(add)] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], weight],
            outputs,
            name=chain[-1].name + "_skip",
            domain=MS_DOMAIN,
            epsilon=float(numpy_helper.to_array(constants[epsilon])),
        )
        removed.update(id(n) for n in chain)
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    if fused and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(fused)


def _norm_after(pow_node, producer, consumers, constants):
    """(the residual Add, [Pow, ReduceMean, Add, Sqrt, Div, Mul], weight, epsilon) when pow_node starts
    norms.py's RMSNorm of a sum of two computed tensors; else None."""
    x = pow_node.input[0]
    add = producer.get(x)
    if add is None or add.op_type != "Add" or any(i in constants for i in add.input):
        return None
    chain = [pow_node]
    for op in ("ReduceMean", "Add", "Sqrt", "Div", "Mul"):
        users = consumers[chain[-1].output[0]]
        if len(users) != 1 or users[0].op_type != op:
            return None
        chain.append(users[0])
    reduce, eps_add, div, mul = chain[1], chain[2], chain[4], chain[5]
    weight = [i for i in mul.input if i != div.output[0]]
    epsilon = [i for i in eps_add.input if i != reduce.output[0]]
    if div.input[0] != x or len(weight) != 1 or weight[0] not in constants or epsilon[0] not in constants:
        return None
    if len(constants[weight[0]].dims) != 1 or _value(constants, pow_node.input[1]) != [2.0]:
        return None
    if len(reduce.input) < 2 or _value(constants, reduce.input[1]) != [-1]:  # opset 18: axes is an input
        return None
    return add, chain, weight[0], epsilon[0]


def _value(constants, name: str) -> list | None:
    from onnx import numpy_helper

    return numpy_helper.to_array(constants[name]).reshape(-1).tolist() if name in constants else None
