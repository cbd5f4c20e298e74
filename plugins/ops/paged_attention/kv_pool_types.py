"""Give a graph's KV pool the recipe's ``kv_cache.dtype``: a pass over ``PagedAttention`` nodes.

The exporter writes float32 pools (the torch op takes no int8 pool). Before lowering, this pass
retypes each ``PagedAttention`` node's pool where the graph binds it, so the node conforms to the
op's description with that pool dtype (docs/contracts.md)::

    past_key.i  [KVH, NB, BS, D] float32  ->  fp16 | bf16 | int8
    present_key.i (the node's key_cache_out) likewise; past_value.i / present_value.i likewise
    int8 only: graph inputs past_key_scale.i / past_value_scale.i [KVH, NB, BS] float32 become the
    node's key_scale / value_scale inputs, and outputs present_key_scale.i / present_value_scale.i
    its key_scale_out / value_scale_out (bound to the same buffers by the runtime: in place)

A pool tensor ``<name>.<i>`` gets scales ``<name>_scale.<i>`` (:func:`scale_name`). The pool must be
a graph input and its ``*_out`` a graph output (the export's form); else :class:`OpError`. Pure
function: returns a new model; a float32 ``kv_dtype`` returns the model unchanged.
"""

from __future__ import annotations

import onnx

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.core.dtypes import DTYPES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import KV_DTYPES, kv_has_scales
from trtpipe.plugins.graph.rewrite import copy_model

__all__ = ["retype_kv_pool", "scale_name"]


def scale_name(pool_tensor: str) -> str:
    """``past_key.3`` -> ``past_key_scale.3`` (the int8 scales beside a pool tensor)."""
    head, dot, layer = pool_tensor.rpartition(".")
    return f"{head}_scale.{layer}" if dot else f"{pool_tensor}_scale"


def retype_kv_pool(model: onnx.ModelProto, kv_dtype: str) -> onnx.ModelProto:
    """The model with every PagedAttention pool typed ``kv_dtype`` (module docstring). Raises
    OpError for an unknown dtype or a pool that is not the graph's own input/output."""
    if kv_dtype not in KV_DTYPES:
        raise OpError(f"kv_dtype={kv_dtype!r}: expected one of {list(KV_DTYPES)}")
    if kv_dtype == "fp32":
        return model
    out = copy_model(model)
    g = out.graph
    inputs = {v.name: v for v in g.input}
    outputs = {v.name: v for v in g.output}
    elem = DTYPES[kv_dtype].onnx_type
    for node in g.node:
        if node.domain != OP_DOMAIN or node.op_type != "PagedAttention":
            continue
        pools = [(node.input[3], node.output[1]), (node.input[4], node.output[2])]
        for past, present in pools:
            if past not in inputs or present not in outputs:
                raise OpError(
                    f"PagedAttention {node.name}: pool {past!r} -> {present!r} is not a graph input/output; "
                    "retype_kv_pool runs on exported graphs, whose pools are"
                )
            inputs[past].type.tensor_type.elem_type = elem
            outputs[present].type.tensor_type.elem_type = elem
        if kv_has_scales(kv_dtype):
            del node.input[9:], node.output[3:]  # the exporter may name unused optional outputs
            while len(node.input) < 9:  # absent optional inputs before the scales (none today)
                node.input.append("")
            for past, _ in pools:
                node.input.append(_add_scale(g.input, inputs[past], scale_name(past)))
            for _, present in pools:
                node.output.append(_add_scale(g.output, outputs[present], scale_name(present)))
    return out


def _add_scale(values, pool: onnx.ValueInfoProto, name: str) -> str:
    """Append ``name`` float32 ``[KVH, NB, BS]`` (the pool's first three dims) to ``values``."""
    dims = pool.type.tensor_type.shape.dim
    shape = [d.dim_param or d.dim_value or None for d in list(dims)[:3]]
    values.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
    return name
