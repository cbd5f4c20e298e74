"""Lower ``trtpipe`` custom nodes to ops that ONNX Runtime runs natively on CPU: the walk that
hands each node to its op's lowering.

* ``Int4Gemm`` -> ``com.microsoft::MatMulNBits`` (same packing; TOOLCHAIN.md), with an
  ``accuracy_level`` chosen by the caller (4 = int8 activations: faster, ~5e-3 relative error):
  :mod:`trtpipe.plugins.ops.int4_gemm.lower_ort`.
* ``PagedAttention`` -> standard ONNX ops over the pool (:mod:`trtpipe.plugins.ops.paged_attention.lower_onnx`,
  shared with TensorRT's plugin-free lowering): ``ScatterND`` writes this step's K/V in place
  (the runtime binds ``past_*`` and ``present_*`` to the same buffer), ``Gather`` by block table
  reads it, masks by ``Where``.

The walk over the graph is :func:`trtpipe.plugins.graph.rewrite.rewrite_custom_nodes`. Passes
are functions ``ModelProto -> ModelProto`` and idempotent (a lowered graph has no ``trtpipe``
nodes left to rewrite).
"""

from __future__ import annotations

import onnx

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import (
    GraphRewrite,
    InitializerView,
    ensure_opset,
    finish_lowering,
    rewrite_custom_nodes,
)
from trtpipe.plugins.ops.int4_gemm.lower_ort import FLOAT_ZERO_POINT_MODES, MS_DOMAIN, lower_int4_gemm
from trtpipe.plugins.ops.paged_attention.kv_pool_types import retype_kv_pool
from trtpipe.plugins.ops.paged_attention.lower_onnx import lower_paged_attention

__all__ = ["MS_DOMAIN", "FLOAT_ZERO_POINT_MODES", "lower_for_ort"]


def lower_for_ort(
    model: onnx.ModelProto,
    accuracy_level: int = 0,
    decode: bool = False,
    float_zero_points: str = "exact",
    split_decode_rows: bool = False,
    kv_dtype: str = "fp32",
) -> onnx.ModelProto:
    """Rewrite every ``trtpipe`` node into ONNX Runtime CPU ops (returns a new ModelProto).

    ``accuracy_level`` is passed to MatMulNBits (0 = fp32 activations, 4 = int8 activations).
    ``float_zero_points``: how 4-bit blocks with float zero points (GGUF Q4_1) are lowered:
    ``"exact"`` (MatMulNBits + blocksum correction) or ``"int8"`` (8-bit integer-zero-point
    blocks, each weight within ``d/32``); see
    :func:`~trtpipe.plugins.ops.int4_gemm.lower_ort.lower_int4_gemm`.
    ``decode``: the graph is a decode graph (one query per sequence, ``query_start_loc`` =
    0..S): attention is lowered without the padded-query re-packing prefill needs.
    ``split_decode_rows`` (prefill graphs): a batch's trailing 1-token rows (decode tokens in a
    prefill call) take the decode attention path instead of being padded to the longest chunk
    (:mod:`trtpipe.plugins.ops.paged_attention.lower_onnx`, 3.); False = the padded path for every row.
    ``kv_dtype``: the pool's dtype (fp32 | fp16 | bf16 | int8): the exported float32 pool is retyped
    first (:func:`~trtpipe.plugins.ops.paged_attention.kv_pool_types.retype_kv_pool`; int8 adds
    the ``past_*_scale.i`` / ``present_*_scale.i`` scale tensors), then attention encodes its
    writes and decodes its reads in the graph.
    Raises :class:`OpError` for an unknown ``trtpipe`` op or an unknown ``float_zero_points``.
    """
    if float_zero_points not in FLOAT_ZERO_POINT_MODES:
        raise OpError(f"float_zero_points={float_zero_points!r}: expected 'exact' or 'int8'")
    model = retype_kv_pool(model, kv_dtype)
    inits = InitializerView(model.graph)

    def rewrite(node: onnx.NodeProto, state: GraphRewrite) -> None:
        if node.op_type == "PagedAttention":
            lower_paged_attention(node, state, decode=decode, split_decode_rows=split_decode_rows, kv_dtype=kv_dtype)
        elif node.op_type == "Int4Gemm":
            lower_int4_gemm(
                node, state, inits=inits, accuracy_level=accuracy_level, float_zero_points=float_zero_points
            )
        else:
            raise OpError(f"no ONNX Runtime lowering for {OP_DOMAIN}::{node.op_type} (node {node.name})")

    out = finish_lowering(rewrite_custom_nodes(model, rewrite))
    ensure_opset(out, MS_DOMAIN, 1)
    return out
