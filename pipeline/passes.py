"""Graph passes for the ONNX Runtime CPU backend: fuse the patterns the torch exporter emits into
ONNX Runtime's fused CPU kernels, so a decode step runs far fewer, larger nodes.

Each pass is a function ``ModelProto -> (ModelProto, count)``: small, named, idempotent (a fused
graph has no pattern left), tested before/after on a one-layer graph (tests/pipeline/test_passes.py).

* :func:`fuse_rms_norm`: ``x * rsqrt(mean(x^2) + eps) * w`` (Pow, ReduceMean, Add, Sqrt,
  Reciprocal, Mul, Mul) -> ``SimplifiedLayerNormalization`` (ORT's RMSNorm kernel).
* :func:`fuse_rotary`: rotate-half RoPE (Reshape, Slice, Neg, Slice, Concat, Mul, Mul, Add,
  Reshape) with cos/sin gathered from a table by position -> ``com.microsoft::RotaryEmbedding``
  (interleaved=0), cos/sin caches = the first half of the tables' columns.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"


class _Graph:
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


def _rebuild(model: onnx.ModelProto, remove: set[int], add_after: dict[int, list[onnx.NodeProto]],
             new_inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    nodes = []
    for i, n in enumerate(model.graph.node):
        if id(n) not in remove:
            nodes.append(n)
        nodes.extend(add_after.get(id(n), []))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(new_inits)
    if not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS, 1))
    return out


def fuse_rms_norm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """RMSNorm subgraphs -> SimplifiedLayerNormalization (axis -1, the same epsilon)."""
    G = _Graph(model)
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
        fused = helper.make_node("SimplifiedLayerNormalization", [x, w[0]], [mul2.output[0]],
                                 name=(mul2.name or "rms") + "/SimplifiedLayerNorm", axis=-1,
                                 epsilon=float(np.asarray(eps).reshape(-1)[0]), stash_type=1)
        for c in chain + [mul2]:
            remove.add(id(c))
        add_after[id(mul2)] = [fused]
        count += 1
    if not count:
        return model, 0
    return _rebuild(model, remove, add_after, []), count


def fuse_rotary(model: onnx.ModelProto, positions: str = "positions") -> tuple[onnx.ModelProto, int]:
    """Rotate-half RoPE on ``[T, heads, D]`` views -> ``com.microsoft::RotaryEmbedding``.

    Pattern (per q or k): ``v = Reshape(x, [T, H, D])``; ``rot = Concat(Neg(Slice(v, D/2:)),
    Slice(v, :D/2))``; ``y = Reshape(v * cos + rot * sin, [T, H*D])`` where ``cos``/``sin`` are
    ``Unsqueeze(GatherND(table, Unsqueeze(positions)))``. The fused node takes ``x [1, T, H*D]``
    and ``position_ids [1, T]``; its caches are ``table[:, :D/2]``.
    """
    G = _Graph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    caches: dict[str, str] = {}
    pos_2d = None
    count = 0
    pre: list[onnx.NodeProto] = []

    def table_of(name: str):
        u = G.prod(name, "Unsqueeze")
        gnd = u and (G.prod(u.input[0], "GatherND") or G.prod(u.input[0], "Gather"))
        return gnd.input[0] if gnd is not None and gnd.input[0] in G.inits else None

    for n in model.graph.node:
        if n.op_type != "Add":
            continue
        m1, m2 = (G.prod(i, "Mul") for i in n.input)
        if not (m1 and m2):
            continue
        # one Mul has (v, cos), the other (cat, sin)
        for a, b in ((m1, m2), (m2, m1)):
            cat = next((G.prod(i, "Concat") for i in b.input if G.prod(i, "Concat")), None)
            if cat is None:
                continue
            sin_in = [i for i in b.input if i != cat.output[0]][0]
            neg = G.prod(cat.input[0], "Neg")
            sl2 = G.prod(cat.input[1], "Slice")
            sl1 = neg and G.prod(neg.input[0], "Slice")
            if not (sl1 and sl2) or sl1.input[0] != sl2.input[0]:
                continue
            v = sl1.input[0]
            if v not in a.input:
                continue
            cos_in = [i for i in a.input if i != v][0]
            cos_t, sin_t = table_of(cos_in), table_of(sin_in)
            view = G.prod(v, "Reshape")
            outs = G.consumers.get(n.output[0], [])
            if not (cos_t and sin_t and view) or len(outs) != 1 or outs[0].op_type != "Reshape":
                continue
            head_dim = int(G.const(cos_t).shape[1])
            shape = G.const(view.input[1])
            if shape is None or len(shape) != 3 or int(shape[-1]) != head_dim:
                continue
            num_heads = int(shape[1])
            final = outs[0]
            for t in (cos_t, sin_t):
                if t not in caches:
                    caches[t] = f"{t}/rotary_half"
                    new_inits.append(numpy_helper.from_array(
                        np.ascontiguousarray(G.const(t)[:, : head_dim // 2]), caches[t]))
            if pos_2d is None:
                pos_2d = "/model/rotary/position_ids_2d"
                axes0 = "/model/rotary/axes0"
                new_inits.append(numpy_helper.from_array(np.array([0], np.int64), axes0))
                pre.append(helper.make_node("Unsqueeze", [positions, axes0], [pos_2d], name="/model/rotary/Unsqueeze"))
            base = final.name or n.name
            x3 = f"{base}/rotary_in"
            y3 = f"{base}/rotary_out"
            fused = [
                helper.make_node("Unsqueeze", [view.input[0], "/model/rotary/axes0"], [x3], name=f"{base}/Unsqueeze"),
                helper.make_node("RotaryEmbedding", [x3, pos_2d, caches[cos_t], caches[sin_t]], [y3],
                                 name=f"{base}/RotaryEmbedding", domain=MS, interleaved=0, num_heads=num_heads),
                helper.make_node("Squeeze", [y3, "/model/rotary/axes0"], [final.output[0]], name=f"{base}/Squeeze"),
            ]
            chain = [sl1, neg, sl2, cat, a, b, n, final]
            if G.single_use(v) is False and len(G.consumers[v]) != 3:
                continue
            for c in chain:
                remove.add(id(c))
            if len(G.consumers.get(view.output[0], [])) == 3:
                remove.add(id(view))
            add_after[id(final)] = fused
            count += 1
            break
    if not count:
        return model, 0
    out = _rebuild(model, remove, add_after, new_inits)
    # position_ids must be defined before its first use: put it first
    nodes = pre + list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, count


def optimize_for_ort(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """All ORT CPU fusions, in order. Returns the model and how many of each were fused."""
    model, n_rms = fuse_rms_norm(model)
    model, n_rope = fuse_rotary(model)
    return model, {"rms_norm": n_rms, "rotary": n_rope}
