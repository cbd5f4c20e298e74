"""``x * rsqrt(mean(x^2) + eps) * w`` (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul) ->
ONNX Runtime's ``SimplifiedLayerNormalization`` (its RMSNorm kernel)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from trtpipe.pipeline.passes.graph import PassGraph, rebuild

__all__ = ["fuse_rms_norm"]


def fuse_rms_norm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """RMSNorm subgraphs -> SimplifiedLayerNormalization (axis -1, the same epsilon)."""
    G = PassGraph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    count = 0
    for n in model.graph.node:
        if n.op_type != "Reciprocal":
            continue
        sqrt = G.prod(n.input[0], "Sqrt")
        add = sqrt and G.prod(sqrt.input[0], "Add")
        mean = add and G.prod(add.input[0], "ReduceMean")
        pw = mean and G.prod(mean.input[0], "Pow")
        if not pw:
            continue
        x = pw.input[0]
        two, eps = G.const(pw.input[1]), G.const(add.input[1])
        if two is None or float(two) != 2.0 or eps is None:
            continue
        users = G.consumers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type != "Mul" or x not in users[0].input:
            continue
        mul1 = users[0]
        users2 = G.consumers.get(mul1.output[0], [])
        if len(users2) != 1 or users2[0].op_type != "Mul":
            continue
        mul2 = users2[0]
        w = [i for i in mul2.input if i != mul1.output[0]]
        if len(w) != 1 or G.const(w[0]) is None:
            continue
        chain = [pw, mean, add, sqrt, n, mul1]
        if not all(G.single_use(c.output[0]) for c in chain[:-1]):
            continue
        fused = helper.make_node(
            "SimplifiedLayerNormalization",
            [x, w[0]],
            [mul2.output[0]],
            name=(mul2.name or "rms") + "/SimplifiedLayerNorm",
            axis=-1,
            epsilon=float(np.asarray(eps).reshape(-1)[0]),
            stash_type=1,
        )
        for c in chain + [mul2]:
            remove.add(id(c))
        add_after[id(mul2)] = [fused]
        count += 1
    if not count:
        return model, 0
    return rebuild(model, remove, add_after, []), count
