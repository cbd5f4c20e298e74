"""Graph passes for the ONNX Runtime CPU backend: fuse the patterns the torch exporter emits into
ONNX Runtime's fused CPU kernels, so a decode step runs far fewer, larger nodes.

Each pass is a function ``ModelProto -> (ModelProto, count)``: small, named, idempotent (a fused
graph has no pattern left), tested before/after on a one-layer graph (tests/pipeline/test_passes.py).

* :func:`fuse_rms_norm`: ``x * rsqrt(mean(x^2) + eps) * w`` (Pow, ReduceMean, Add, Sqrt,
  Reciprocal, Mul, Mul) -> ``SimplifiedLayerNormalization`` (ORT's RMSNorm kernel).
* :func:`fuse_rotary`: rotate-half RoPE (Reshape, Slice, Neg, Slice, Concat, Mul, Mul, Add,
  Reshape) with cos/sin gathered from a table by position -> ``com.microsoft::RotaryEmbedding``
  (interleaved=0), cos/sin caches = the first half of the tables' columns.
* :func:`fuse_int4_siblings`: ``trtpipe::Int4Gemm`` nodes that read the same activation (q/k/v,
  gate/up) -> one ``Int4Gemm`` over the row-concatenated weights + ``Split``: one larger kernel
  instead of several small ones (and, for float zero points, one mins term; ort_lowering).
* :func:`merge_rotary_qk`: the q and k ``RotaryEmbedding`` of one layer, when both come from the
  same fused q/k/v ``Split`` -> one ``RotaryEmbedding`` over the q||k heads (the same rotation per
  head and position) + ``Split``.
* :func:`fuse_silu`: ``x * sigmoid(x)`` -> ``com.microsoft::QuickGelu(alpha=1)``.
"""

from __future__ import annotations

import heapq
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


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _toposort(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
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


def _rebuild(model: onnx.ModelProto, remove: set[int], add_after: dict[int, list[onnx.NodeProto]],
             new_inits: list[onnx.TensorProto], prepend: list[onnx.NodeProto] = ()) -> onnx.ModelProto:
    nodes = list(prepend)
    for i, n in enumerate(model.graph.node):
        if id(n) not in remove:
            nodes.append(n)
        nodes.extend(add_after.get(id(n), []))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.initializer.extend(new_inits)
    out.graph.node.extend(_toposort(nodes, out.graph))
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
    return _rebuild(model, remove, add_after, new_inits, prepend=pre), count


def fuse_int4_siblings(model: onnx.ModelProto, op_domain: str = "trtpipe") -> tuple[onnx.ModelProto, int]:
    """``Int4Gemm`` nodes sharing their activation input -> one ``Int4Gemm`` + ``Split`` (axis -1).

    Siblings must agree on K, group_size, bits and the zero-point form (absent, uint8 or float);
    their B / scales / zero_points are initializers used by that node only and are concatenated
    along N (row-major ``[N, ...]`` layouts, so each output row keeps its own blocks: the result
    is bit-identical). Returns ``(model, number of fused groups)``.
    """
    G = _Graph(model)
    groups: dict[tuple, list[onnx.NodeProto]] = defaultdict(list)
    for n in model.graph.node:
        if n.domain != op_domain or n.op_type != "Int4Gemm":
            continue
        ins = list(n.input)
        if not all(i in G.inits and G.single_use(i) for i in ins[1:] if i):
            continue
        a = _attrs(n)
        zp = ins[3] if len(ins) > 3 and ins[3] else None
        zp_kind = None if zp is None else G.inits[zp].data_type
        groups[(ins[0], a["K"], a["group_size"], a.get("bits", 4), zp_kind, G.inits[ins[2]].data_type)].append(n)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    dead: set[str] = set()
    count = 0
    for key, nodes in groups.items():
        if len(nodes) < 2:
            continue
        first = nodes[0]
        attrs = _attrs(first)
        ns = [int(_attrs(n)["N"]) for n in nodes]
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
        # placed where the last sibling was; _rebuild re-sorts so earlier siblings' consumers follow
        add_after[id(nodes[-1])] = fused
        count += 1
    if not count:
        return model, 0
    out = _rebuild(model, remove, add_after, new_inits)
    keep = [t for t in out.graph.initializer if t.name not in dead]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    return out, count


def merge_rotary_qk(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Two ``Squeeze(RotaryEmbedding(Unsqueeze(x_i)))`` chains over adjacent outputs of one
    ``Split`` (q then k of a fused q/k/v GEMM), with the same positions and caches ->
    ``Split`` into (q||k, rest), one RotaryEmbedding with ``num_heads = Hq + Hk``, and a ``Split``
    back to q and k. Exact: RoPE rotates each head by its position alone."""
    G = _Graph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    count = 0

    def chain(name: str):
        users = G.consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != "Unsqueeze":
            return None
        u = users[0]
        r = G.consumers.get(u.output[0], [])
        if len(r) != 1 or r[0].op_type != "RotaryEmbedding":
            return None
        sq = G.consumers.get(r[0].output[0], [])
        if len(sq) != 1 or sq[0].op_type != "Squeeze":
            return None
        return u, r[0], sq[0]

    for sp in model.graph.node:
        if sp.op_type != "Split" or len(sp.output) < 2 or len(sp.input) < 2:
            continue
        sizes = G.const(sp.input[1])
        if sizes is None:
            continue
        cq, ck = chain(sp.output[0]), chain(sp.output[1])
        if not (cq and ck):
            continue
        rq, rk = cq[1], ck[1]
        if list(rq.input[1:]) != list(rk.input[1:]):
            continue
        aq, ak = _attrs(rq), _attrs(rk)
        if aq.get("interleaved", 0) != ak.get("interleaved", 0) or any(
                k in aq or k in ak for k in ("rotary_embedding_dim", "is_packed_batching", "scale")):
            continue
        nq, nk = int(sizes[0]), int(sizes[1])
        base = (sp.name or "qkv") + "/rotary_qk"
        sizes_outer = [nq + nk] + [int(s) for s in sizes[2:]]
        s1, s2 = f"{base}/split_outer", f"{base}/split_qk"
        new_inits += [numpy_helper.from_array(np.array(sizes_outer, np.int64), s1),
                      numpy_helper.from_array(np.array([nq, nk], np.int64), s2)]
        qk, qk3, qk3r, qkr = (f"{base}/{t}" for t in ("qk", "qk3", "qk3_rot", "qk_rot"))
        axes = cq[0].input[1]
        attrs = dict(aq)
        attrs["num_heads"] = int(aq["num_heads"]) + int(ak["num_heads"])
        new = [
            helper.make_node("Split", [sp.input[0], s1], [qk] + list(sp.output[2:]), name=f"{base}/Split", axis=-1),
            helper.make_node("Unsqueeze", [qk, axes], [qk3], name=f"{base}/Unsqueeze"),
            helper.make_node("RotaryEmbedding", [qk3] + list(rq.input[1:]), [qk3r], name=f"{base}/RotaryEmbedding",
                             domain=MS, **attrs),
            helper.make_node("Squeeze", [qk3r, axes], [qkr], name=f"{base}/Squeeze"),
            helper.make_node("Split", [qkr, s2], [cq[2].output[0], ck[2].output[0]], name=f"{base}/Split_qk", axis=-1),
        ]
        for c in (sp, *cq, *ck):
            remove.add(id(c))
        add_after[id(sp)] = new
        count += 1
    if not count:
        return model, 0
    return _rebuild(model, remove, add_after, new_inits), count


def fuse_silu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Mul(x, Sigmoid(x))`` -> ``com.microsoft::QuickGelu(x, alpha=1)`` (= SiLU). ONNX Runtime
    does this itself, except where x is a Split output (the fused gate/up GEMM)."""
    G = _Graph(model)
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
                add_after[id(n)] = [helper.make_node("QuickGelu", [x], [n.output[0]], name=(n.name or "silu") + "/QuickGelu",
                                                     domain=MS, alpha=1.0)]
                count += 1
                break
    if not count:
        return model, 0
    return _rebuild(model, remove, add_after, []), count


def optimize_for_ort(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """All ORT CPU fusions, in order. Returns the model and how many of each were fused."""
    model, n_rms = fuse_rms_norm(model)
    model, n_rope = fuse_rotary(model)
    model, n_int4 = fuse_int4_siblings(model)
    model, n_qk = merge_rotary_qk(model)
    model, n_silu = fuse_silu(model)
    return model, {"rms_norm": n_rms, "rotary": n_rope, "int4_siblings": n_int4, "rotary_qk": n_qk, "silu": n_silu}
