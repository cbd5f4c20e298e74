"""``x * sigmoid(x)`` -> ``com.microsoft::QuickGelu(alpha=1)`` (= SiLU)."""

from __future__ import annotations

import onnx
from onnx import helper

from trtpipe.pipeline.passes.graph import MS, PassGraph, rebuild

__all__ = ["fuse_silu"]


def fuse_silu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Mul(x, Sigmoid(x))`` -> ``com.microsoft::QuickGelu(x, alpha=1)`` (= SiLU). ONNX Runtime
    does this itself, except where x is a Split output (the fused gate/up GEMM)."""
    G = PassGraph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    count = 0
    for n in model.graph.node:
        if n.op_type != "Mul":
            continue
        for x, s in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
            sig = G.prod(s, "Sigmoid")
            if sig is not None and sig.input[0] == x and G.single_use(s):
                remove.update((id(sig), id(n)))
                add_after[id(n)] = [
                    helper.make_node(
                        "QuickGelu", [x], [n.output[0]], name=(n.name or "silu") + "/QuickGelu", domain=MS, alpha=1.0
                    )
                ]
                count += 1
                break
    if not count:
        return model, 0
    return rebuild(model, remove, add_after, []), count
