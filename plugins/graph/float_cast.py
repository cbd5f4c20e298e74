"""The float cast pass of the TensorRT lowering: fp32 graphs -> fp16 / bf16 activations.

The exported graphs are fp32; GPU phases run fp16 (or bf16) activations. Float initializers,
constants, graph inputs and ``present_*`` outputs take the target dtype; int64 index tensors
are untouched. RMSNorm statistics (``Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal``) stay
fp32 islands, because a squared fp16 activation overflows at |x| > 255::

    x ─Cast─► x/to_fp32 ─Pow─ReduceMean─Add─Sqrt─Reciprocal─► r ─Cast─► r/to_fp16 ─Mul─► ...

``logits`` stay fp32 (one Cast on ``[S, V]``) for the sampler. A pass ``ModelProto ->
ModelProto`` (returns a new model), idempotent through ``metadata_props["trtpipe.float_dtype"]``.
dtype names and ONNX element types come from the one table, :mod:`trtpipe.plugins.core.dtypes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto, helper, numpy_helper

from trtpipe.plugins.core.dtypes import DTYPES, FLOAT_NAMES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import copy_model

__all__ = ["FLOAT_TYPES", "cast_float_graph"]

FLOAT_TYPES: dict[str, int] = {name: DTYPES[name].onnx_type for name in FLOAT_NAMES}  # "fp16" -> FLOAT16 ...
_CAST_MARK = "trtpipe.float_dtype"  # metadata_props key: the cast pass ran (idempotence)
_NORM_CHAIN_OPS = ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Div")


def _np_float(dtype: str) -> Any:
    """The numpy scalar type of a float recipe dtype (NumPy has no bfloat16: ml_dtypes')."""
    np_dtype = DTYPES[dtype].numpy
    if np_dtype is None:  # bf16
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np_dtype.type


def cast_float_graph(
    model: onnx.ModelProto,
    dtype: str = "fp16",
    *,
    kv_dtype: str | None = None,
    keep_fp32_outputs: tuple[str, ...] = ("logits",),
) -> onnx.ModelProto:
    """Convert an fp32 graph to ``dtype`` ("fp16" | "bf16") activations and weights.

    ``kv_dtype`` (default: ``dtype``) must equal ``dtype``: the pool is read and written by the
    same layers. Outputs named in ``keep_fp32_outputs`` stay float32 through a final Cast.
    A graph this pass already cast (``metadata_props["trtpipe.float_dtype"]``) is returned
    unchanged (idempotent); ``dtype="fp32"`` returns a copy.

    Raises :class:`OpError` for an unknown dtype, a KV dtype different from ``dtype``, or a graph
    already cast to another dtype.
    """
    if dtype == "fp32":
        return copy_model(model)
    if dtype not in FLOAT_TYPES:
        raise OpError(f"cast dtype {dtype!r}: expected one of {sorted(FLOAT_TYPES)}")
    if (kv_dtype or dtype) != dtype:
        raise OpError(
            f"kv_cache.dtype {kv_dtype} differs from the activation dtype {dtype}: the TensorRT "
            f"graphs read and write the pool in the activation dtype. Fix: set kv_cache.dtype: {dtype}."
        )
    out = copy_model(model)
    done = {p.key: p.value for p in out.metadata_props}.get(_CAST_MARK)
    if done == dtype:
        return out
    if done is not None:
        raise OpError(f"graph already cast to {done}; cast the fp32 graph to {dtype} instead")
    g = out.graph
    island = _norm_islands(g)
    # tensors read only by island nodes stay fp32 (eps, the exponent 2)
    readers: dict[str, set[bool]] = {}
    for i, n in enumerate(g.node):
        for x in n.input:
            readers.setdefault(x, set()).add(i in island)
    only_island = {name for name, kinds in readers.items() if kinds == {True}}
    cast = _Cast(
        dtype,
        FLOAT_TYPES[dtype],
        _np_float(dtype),
        _non_float_constants(out),
        island,
        {o for i in island for o in g.node[i].output},
        only_island,
    )
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in only_island:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(cast.np_type), t.name))
    new_nodes: list[onnx.NodeProto] = []
    for i, n in enumerate(g.node):
        (_cast_island_node if i in island else _cast_node)(n, cast, new_nodes)
        new_nodes.append(n)
    _cast_graph_io(g, cast, new_nodes, keep_fp32_outputs)
    del g.node[:]
    g.node.extend(new_nodes)
    del g.value_info[:]  # stale float32 types; TensorRT infers its own
    out.metadata_props.add(key=_CAST_MARK, value=dtype)
    return out


@dataclass(frozen=True)
class _Cast:
    """What the cast pass decided about one graph (tensor names)."""

    dtype: str  # "fp16" | "bf16"
    to: int  # its onnx.TensorProto enum value
    np_type: Any  # its numpy scalar type (ml_dtypes.bfloat16 for bf16)
    not_float: set[str]  # initializers / Constant outputs that are not float32 (shapes, indices)
    island: set[int]  # indices of RMSNorm-statistics nodes that stay fp32
    island_tensors: set[str]  # their outputs
    only_island: set[str]  # tensors read only by island nodes (eps, the exponent 2): stay fp32


def _cast_input(n: onnx.NodeProto, k: int, x: str, suffix: str, to: int, new_nodes: list[onnx.NodeProto]) -> None:
    """Read input ``k`` of ``n`` through a ``Cast`` of ``x`` (one per tensor and direction)."""
    c = f"{x}/{suffix}"
    if not any(m.output[0] == c for m in new_nodes):
        new_nodes.append(helper.make_node("Cast", [x], [c], name=c, to=to))
    n.input[k] = c


def _cast_island_node(n: onnx.NodeProto, cast: _Cast, new_nodes: list[onnx.NodeProto]) -> None:
    """An fp32 island node reads cast activations through ``<x>/to_fp32``."""
    for k, x in enumerate(n.input):
        if x and x not in cast.not_float and x not in cast.island_tensors and x not in cast.only_island:
            _cast_input(n, k, x, "to_fp32", TensorProto.FLOAT, new_nodes)


def _cast_node(n: onnx.NodeProto, cast: _Cast, new_nodes: list[onnx.NodeProto]) -> None:
    """A node outside the islands: island outputs come back through ``<x>/to_<dtype>``; float
    constants, ``Cast(to=float)`` and ``ConstantOfShape`` values take the target dtype."""
    for k, x in enumerate(n.input):
        if x in cast.island_tensors:
            _cast_input(n, k, x, f"to_{cast.dtype}", cast.to, new_nodes)
    if n.op_type == "Constant":
        for a in n.attribute:
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT and not set(n.output) <= cast.only_island:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(cast.np_type), a.t.name))
    for a in n.attribute:
        if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
            a.i = cast.to
        if n.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == TensorProto.FLOAT:
            a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(cast.np_type), a.t.name))


def _cast_graph_io(
    g: onnx.GraphProto, cast: _Cast, new_nodes: list[onnx.NodeProto], keep_fp32_outputs: tuple[str, ...]
) -> None:
    """Float graph inputs and outputs take the target dtype, except ``keep_fp32_outputs``: their
    producer writes ``<name>/<dtype>`` and a final ``Cast`` restores the float32 output."""
    for vi in g.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = cast.to
    for vi in g.output:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if vi.name not in keep_fp32_outputs:
            vi.type.tensor_type.elem_type = cast.to
            continue
        inner = f"{vi.name}/{cast.dtype}"
        for n in new_nodes:
            for k, x in enumerate(n.output):
                if x == vi.name:
                    n.output[k] = inner
            for k, x in enumerate(n.input):
                if x == vi.name:
                    n.input[k] = inner
        new_nodes.append(helper.make_node("Cast", [inner], [vi.name], name=f"{vi.name}/to_fp32", to=TensorProto.FLOAT))


def _non_float_constants(model: onnx.ModelProto) -> set[str]:
    """Initializers and Constant outputs whose type is not float32 (axes, shapes, indices)."""
    out = {t.name for t in model.graph.initializer if t.data_type != TensorProto.FLOAT}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type != TensorProto.FLOAT:
                    out.update(n.output)
    return out


def _norm_islands(graph: onnx.GraphProto) -> set[int]:
    """Indices of nodes in RMSNorm statistic chains: Pow -> (ReduceMean|Add|Sqrt|Reciprocal|Div)*,
    each link the single consumer of the previous output."""
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for x in n.input:
            consumers.setdefault(x, []).append(i)
    keep: set[int] = set()
    for i, n in enumerate(graph.node):
        if n.op_type != "Pow":
            continue
        chain, cur = [i], n
        while len(consumers.get(cur.output[0], [])) == 1:
            j = consumers[cur.output[0]][0]
            nxt = graph.node[j]
            if nxt.op_type not in _NORM_CHAIN_OPS:
                break
            chain.append(j)
            cur = nxt
        if any(graph.node[j].op_type == "ReduceMean" for j in chain):
            keep.update(chain)
    return keep
