"""What every ORT fusion pass shares: producer/consumer maps over a graph (:class:`PassGraph`),
a stable topological sort, and :func:`rebuild` (remove matched nodes, insert fused ones, re-sort).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

import onnx
from onnx import numpy_helper

from trtpipe.plugins.graph.rewrite import copy_model, ensure_opset

__all__ = ["MS", "PassGraph", "rebuild", "toposort"]

MS = "com.microsoft"


class PassGraph:
    """Producer/consumer maps and initializer lookup over a GraphProto."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.g = model.graph
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.g.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.inits = {t.name: t for t in self.g.initializer}
        self.graph_outputs = {o.name for o in self.g.output}

    def const(self, name: str):
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            return numpy_helper.to_array(p.attribute[0].t)
        return None

    def prod(self, name: str, op: str):
        p = self.producer.get(name)
        return p if p is not None and p.op_type == op else None

    def single_use(self, name: str) -> bool:
        return len(self.consumers.get(name, ())) == 1 and name not in self.graph_outputs


def toposort(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Stable topological order (Kahn; ties keep the given order), so a pass may append a fused
    node after consumers of one of its outputs. Raises ValueError on a cycle or a missing input."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    deps = [set() for _ in nodes]
    users: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(nodes):
        for i in n.input:
            if i in producer:
                if producer[i] != k and producer[i] not in deps[k]:
                    deps[k].add(producer[i])
                    users[producer[i]].append(k)
            elif i not in known:
                raise ValueError(f"node {n.name}: input {i!r} has no producer")
    ready = [k for k in range(len(nodes)) if not deps[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for u in users[k]:
            deps[u].discard(k)
            if not deps[u]:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("graph has a cycle")
    return order


def rebuild(
    model: onnx.ModelProto,
    remove: set[int],
    add_after: dict[int, list[onnx.NodeProto]],
    new_inits: list[onnx.TensorProto],
    prepend: list[onnx.NodeProto] = (),
) -> onnx.ModelProto:
    """A copy of ``model`` without the nodes whose ``id()`` is in ``remove``, with
    ``add_after[id(n)]`` inserted after node n, ``prepend`` first and ``new_inits`` appended,
    topologically re-sorted, importing the ``com.microsoft`` opset."""
    nodes = list(prepend)
    for n in model.graph.node:
        if id(n) not in remove:
            nodes.append(n)
        nodes.extend(add_after.get(id(n), []))
    out = copy_model(model)
    del out.graph.node[:]
    out.graph.initializer.extend(new_inits)
    out.graph.node.extend(toposort(nodes, out.graph))
    ensure_opset(out, MS, 1)
    return out
