"""Rotary embedding fusions for ONNX Runtime: rotate-half RoPE -> ``com.microsoft::RotaryEmbedding``
(:func:`fuse_rotary`), and the q and k rotations of one layer merged into one node
(:func:`merge_rotary_qk`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtpipe.pipeline.passes.graph import MS, PassGraph, rebuild
from trtpipe.plugins.graph.rewrite import node_attributes

__all__ = ["fuse_rotary", "merge_rotary_qk"]


@dataclass(frozen=True)
class _RotateHalf:
    """One matched rotate-half RoPE: the nodes it replaces and what the fused node needs."""

    chain: tuple[onnx.NodeProto, ...]  # Slice, Neg, Slice, Concat, Mul, Mul, Add, final Reshape
    view: onnx.NodeProto  # Reshape(x, [T, H, D]) feeding the slices
    final: onnx.NodeProto  # Reshape back to [T, H*D]
    cos_table: str  # initializer [P, D]
    sin_table: str
    head_dim: int
    num_heads: int


def _table_of(G: PassGraph, name: str) -> str | None:
    """The cos/sin table initializer behind ``Unsqueeze(Gather[ND](table, positions))``."""
    u = G.prod(name, "Unsqueeze")
    gnd = u and (G.prod(u.input[0], "GatherND") or G.prod(u.input[0], "Gather"))
    return gnd.input[0] if gnd is not None and gnd.input[0] in G.inits else None


def _match_rotate_half(G: PassGraph, n: onnx.NodeProto, a: onnx.NodeProto, b: onnx.NodeProto) -> _RotateHalf | None:
    """``n = Add(a, b)`` with ``a = v * cos`` and ``b = Concat(-v[D/2:], v[:D/2]) * sin``."""
    cat = next((G.prod(i, "Concat") for i in b.input if G.prod(i, "Concat")), None)
    if cat is None:
        return None
    sin_in = [i for i in b.input if i != cat.output[0]][0]
    neg = G.prod(cat.input[0], "Neg")
    sl2 = G.prod(cat.input[1], "Slice")
    sl1 = neg and G.prod(neg.input[0], "Slice")
    if not (sl1 and sl2) or sl1.input[0] != sl2.input[0]:
        return None
    v = sl1.input[0]
    if v not in a.input:
        return None
    cos_in = [i for i in a.input if i != v][0]
    cos_t, sin_t = _table_of(G, cos_in), _table_of(G, sin_in)
    view = G.prod(v, "Reshape")
    outs = G.consumers.get(n.output[0], [])
    if not (cos_t and sin_t and view) or len(outs) != 1 or outs[0].op_type != "Reshape":
        return None
    head_dim = int(G.const(cos_t).shape[1])
    shape = G.const(view.input[1])
    if shape is None or len(shape) != 3 or int(shape[-1]) != head_dim:
        return None
    if G.single_use(v) is False and len(G.consumers[v]) != 3:
        return None
    return _RotateHalf((sl1, neg, sl2, cat, a, b, n, outs[0]), view, outs[0], cos_t, sin_t, head_dim, int(shape[1]))


def fuse_rotary(model: onnx.ModelProto, positions: str = "positions") -> tuple[onnx.ModelProto, int]:
    """Rotate-half RoPE on ``[T, heads, D]`` views -> ``com.microsoft::RotaryEmbedding``.

    Pattern (per q or k): ``v = Reshape(x, [T, H, D])``; ``rot = Concat(Neg(Slice(v, D/2:)),
    Slice(v, :D/2))``; ``y = Reshape(v * cos + rot * sin, [T, H*D])`` where ``cos``/``sin`` are
    ``Unsqueeze(GatherND(table, Unsqueeze(positions)))``. The fused node takes ``x [1, T, H*D]``
    and ``position_ids [1, T]``; its caches are ``table[:, :D/2]``.
    """
    G = PassGraph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    caches: dict[str, str] = {}  # table -> its half-width cache initializer
    pre: list[onnx.NodeProto] = []  # position_ids [1, T], built once
    count = 0
    for n in model.graph.node:
        m1, m2 = (G.prod(i, "Mul") for i in n.input) if n.op_type == "Add" else (None, None)
        if not (m1 and m2):
            continue
        # one Mul has (v, cos), the other (cat, sin)
        match = _match_rotate_half(G, n, m1, m2) or _match_rotate_half(G, n, m2, m1)
        if match is None:
            continue
        for t in (match.cos_table, match.sin_table):
            if t not in caches:
                caches[t] = f"{t}/rotary_half"
                new_inits.append(
                    numpy_helper.from_array(np.ascontiguousarray(G.const(t)[:, : match.head_dim // 2]), caches[t])
                )
        if not pre:
            new_inits.append(numpy_helper.from_array(np.array([0], np.int64), _AXES0))
            pre.append(helper.make_node("Unsqueeze", [positions, _AXES0], [_POS_2D], name="/model/rotary/Unsqueeze"))
        remove.update(id(c) for c in match.chain)
        if len(G.consumers.get(match.view.output[0], [])) == 3:
            remove.add(id(match.view))
        add_after[id(match.final)] = _rotary_nodes(match, caches)
        count += 1
    if not count:
        return model, 0
    return rebuild(model, remove, add_after, new_inits, prepend=pre), count


_POS_2D = "/model/rotary/position_ids_2d"
_AXES0 = "/model/rotary/axes0"


def _rotary_nodes(match: _RotateHalf, caches: dict[str, str]) -> list[onnx.NodeProto]:
    """``Squeeze(RotaryEmbedding(Unsqueeze(x), position_ids, cos_half, sin_half))`` writing the
    matched chain's output."""
    final = match.final
    base = final.name or match.chain[6].name
    x3 = f"{base}/rotary_in"
    y3 = f"{base}/rotary_out"
    return [
        helper.make_node("Unsqueeze", [match.view.input[0], _AXES0], [x3], name=f"{base}/Unsqueeze"),
        helper.make_node(
            "RotaryEmbedding",
            [x3, _POS_2D, caches[match.cos_table], caches[match.sin_table]],
            [y3],
            name=f"{base}/RotaryEmbedding",
            domain=MS,
            interleaved=0,
            num_heads=match.num_heads,
        ),
        helper.make_node("Squeeze", [y3, _AXES0], [final.output[0]], name=f"{base}/Squeeze"),
    ]


def _rotary_chain(G: PassGraph, name: str) -> tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto] | None:
    """``(Unsqueeze, RotaryEmbedding, Squeeze)`` when ``name``'s only reader starts that chain."""
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


def merge_rotary_qk(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Two ``Squeeze(RotaryEmbedding(Unsqueeze(x_i)))`` chains over adjacent outputs of one
    ``Split`` (q then k of a fused q/k/v GEMM), with the same positions and caches ->
    ``Split`` into (q||k, rest), one RotaryEmbedding with ``num_heads = Hq + Hk``, and a ``Split``
    back to q and k. Exact: RoPE rotates each head by its position alone."""
    G = PassGraph(model)
    remove: set[int] = set()
    add_after: dict[int, list] = {}
    new_inits: list[onnx.TensorProto] = []
    count = 0
    for sp in model.graph.node:
        if sp.op_type != "Split" or len(sp.output) < 2 or len(sp.input) < 2:
            continue
        sizes = G.const(sp.input[1])
        if sizes is None:
            continue
        cq, ck = _rotary_chain(G, sp.output[0]), _rotary_chain(G, sp.output[1])
        if not (cq and ck):
            continue
        rq, rk = cq[1], ck[1]
        if list(rq.input[1:]) != list(rk.input[1:]):
            continue
        aq, ak = node_attributes(rq), node_attributes(rk)
        if aq.get("interleaved", 0) != ak.get("interleaved", 0) or any(
            k in aq or k in ak for k in ("rotary_embedding_dim", "is_packed_batching", "scale")
        ):
            continue
        add_after[id(sp)] = _merged_qk_nodes(sp, cq, ck, [int(x) for x in sizes], aq, ak, new_inits)
        remove.update(id(c) for c in (sp, *cq, *ck))
        count += 1
    if not count:
        return model, 0
    return rebuild(model, remove, add_after, new_inits), count


def _merged_qk_nodes(
    sp: onnx.NodeProto, cq: tuple, ck: tuple, sizes: list[int], aq: dict, ak: dict, new_inits: list[onnx.TensorProto]
) -> list[onnx.NodeProto]:
    """Split(q||k, rest) -> one RotaryEmbedding over Hq + Hk heads -> Split(q, k), writing the
    outputs of the two replaced Squeeze nodes (split sizes appended to ``new_inits``)."""
    nq, nk = sizes[0], sizes[1]
    rq = cq[1]
    base = (sp.name or "qkv") + "/rotary_qk"
    s1, s2 = f"{base}/split_outer", f"{base}/split_qk"
    new_inits += [
        numpy_helper.from_array(np.array([nq + nk] + sizes[2:], np.int64), s1),
        numpy_helper.from_array(np.array([nq, nk], np.int64), s2),
    ]
    qk, qk3, qk3r, qkr = (f"{base}/{t}" for t in ("qk", "qk3", "qk3_rot", "qk_rot"))
    axes = cq[0].input[1]
    attrs = dict(aq)
    attrs["num_heads"] = int(aq["num_heads"]) + int(ak["num_heads"])
    return [
        helper.make_node("Split", [sp.input[0], s1], [qk] + list(sp.output[2:]), name=f"{base}/Split", axis=-1),
        helper.make_node("Unsqueeze", [qk, axes], [qk3], name=f"{base}/Unsqueeze"),
        helper.make_node(
            "RotaryEmbedding", [qk3] + list(rq.input[1:]), [qk3r], name=f"{base}/RotaryEmbedding", domain=MS, **attrs
        ),
        helper.make_node("Squeeze", [qk3r, axes], [qkr], name=f"{base}/Squeeze"),
        helper.make_node("Split", [qkr, s2], [cq[2].output[0], ck[2].output[0]], name=f"{base}/Split_qk", axis=-1),
    ]
