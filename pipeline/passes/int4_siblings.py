"""``trtpipe::Int4Gemm`` nodes that read the same activation (q/k/v, gate/up) -> one ``Int4Gemm``
over the row-concatenated weights + ``Split``: one larger kernel instead of several small ones
(and, for float zero points, one mins term in the ONNX Runtime lowering)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtpipe.pipeline.passes.graph import PassGraph, rebuild
from trtpipe.plugins.graph.rewrite import node_attributes

__all__ = ["fuse_int4_siblings"]


def fuse_int4_siblings(model: onnx.ModelProto, op_domain: str = "trtpipe") -> tuple[onnx.ModelProto, int]:
    """``Int4Gemm`` nodes sharing their activation input -> one ``Int4Gemm`` + ``Split`` (axis -1).

    Siblings must agree on K, group_size, bits and the zero-point form (absent, uint8 or float);
    their B / scales / zero_points are initializers used by that node only and are concatenated
    along N (row-major ``[N, ...]`` layouts, so each output row keeps its own blocks: the result
    is bit-identical). Returns ``(model, number of fused groups)``.
    """
    G = PassGraph(model)
    groups = _sibling_groups(G, op_domain)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    dead: set[str] = set()
    count = 0
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        first = nodes[0]
        attrs = node_attributes(first)
        ns = [int(node_attributes(n)["N"]) for n in nodes]
        base = (first.name or "int4_gemm") + "/fused"
        fused_ins = [first.input[0]]
        for j in range(1, len(first.input)):
            if not first.input[j]:
                fused_ins.append("")
                continue
            arr = np.concatenate([G.const(n.input[j]) for n in nodes], axis=0)
            name = f"{base}/{('B', 'scales', 'zero_points')[j - 1]}"
            new_inits.append(numpy_helper.from_array(arr, name))
            fused_ins.append(name)
            dead.update(n.input[j] for n in nodes)
        attrs["N"] = sum(ns)
        y = f"{base}/Y"
        split_name = f"{base}/split_sizes"
        new_inits.append(numpy_helper.from_array(np.array(ns, np.int64), split_name))
        fused = [
            helper.make_node("Int4Gemm", fused_ins, [y], name=f"{base}/Int4Gemm", domain=op_domain, **attrs),
            helper.make_node("Split", [y, split_name], [n.output[0] for n in nodes], name=f"{base}/Split", axis=-1),
        ]
        for n in nodes:
            remove.add(id(n))
        # placed where the last sibling was; rebuild re-sorts so earlier siblings' consumers follow
        add_after[id(nodes[-1])] = fused
        count += 1
    if not count:
        return model, 0
    out = rebuild(model, remove, add_after, new_inits)
    keep = [t for t in out.graph.initializer if t.name not in dead]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    return out, count


def _sibling_groups(G: PassGraph, op_domain: str) -> dict[tuple, list[onnx.NodeProto]]:
    """``Int4Gemm`` nodes whose weights are single-use initializers, grouped by (activation, K,
    group_size, bits, zero-point dtype, scales dtype), in graph order."""
    groups: dict[tuple, list[onnx.NodeProto]] = defaultdict(list)
    for n in G.g.node:
        if n.domain != op_domain or n.op_type != "Int4Gemm":
            continue
        ins = list(n.input)
        if not all(i in G.inits and G.single_use(i) for i in ins[1:] if i):
            continue
        a = node_attributes(n)
        zp = ins[3] if len(ins) > 3 and ins[3] else None
        zp_kind = None if zp is None else G.inits[zp].data_type
        groups[(ins[0], a["K"], a["group_size"], a.get("bits", 4), zp_kind, G.inits[ins[2]].data_type)].append(n)
    return groups
