"""TensorRT's plugin-free lowering: every ``trtpipe`` node in standard ONNX ops, through the walk
that hands each node to its op's lowering.

For TensorRT < 10.7 (JetPack 6) and the TensorRT-RTX smoke build, which have no Python AOT
plugins. ``PagedAttention`` is the standard-op attention shared with the ONNX Runtime lowering
(:mod:`trtpipe.plugins.ops.paged_attention.lower_onnx`: ``ScatterND`` write, ``Gather`` by block table,
causal + window masks); ``Int4Gemm`` is blockwise INT4 ``DequantizeLinear`` + ``MatMul``,
symmetric only, with the asymmetric-weight choices of ``asymmetric_int4``
(:mod:`trtpipe.plugins.ops.int4_gemm.lower_trt_plugin_free`); ``bits=8`` (an 8-bit LM head)
becomes a float ``MatMul`` (also in the plugin lowering).

Cost of going plugin-free: TensorRT's ``ScatterND`` writes a new output tensor, so each step
copies every layer's pool (the plugin writes in place); attention reads ``MB * block_size``
keys per sequence. Fine for a smoke build and small pools; the plugins are the fast path.
"""

from __future__ import annotations

import onnx

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, finish_lowering, rewrite_custom_nodes
from trtpipe.plugins.ops.int4_gemm.lower_trt_plugin_free import ASYMMETRIC_INT4_MODES, lower_int4_gemm_dq
from trtpipe.plugins.ops.paged_attention.lower_onnx import lower_paged_attention

__all__ = ["ASYMMETRIC_INT4_MODES", "lower_plugin_free"]

_BLOCKWISE_DQ_OPSET = 21  # blockwise DequantizeLinear (block_size attribute)


def lower_plugin_free(
    model: onnx.ModelProto, *, decode: bool = False, asymmetric_int4: str = "refuse"
) -> onnx.ModelProto:
    """Rewrite every ``trtpipe`` node into standard ONNX ops TensorRT parses without plugins.

    ``decode``: one query token per sequence (the split layout's decode graph), which takes the
    decode-specialized attention (no padded query layout).
    ``asymmetric_int4``: what asymmetric INT4 weights become (see
    :func:`~trtpipe.plugins.ops.int4_gemm.lower_trt_plugin_free.lower_int4_gemm_dq`):
    ``refuse``, ``requantize_symmetric`` (not exact; the build measures the model's agreement) or
    ``dequantize_float``.
    Raises :class:`OpError` for asymmetric INT4 weights (unless re-quantized) or an unknown
    ``trtpipe`` op.
    Idempotent (a lowered graph has no ``trtpipe`` node). The default opset is raised to 21.
    """
    inits = {t.name: t for t in model.graph.initializer}

    def rewrite(node: onnx.NodeProto, state: GraphRewrite) -> None:
        if node.op_type == "PagedAttention":
            lower_paged_attention(node, state, decode=decode)
        elif node.op_type == "Int4Gemm":
            lower_int4_gemm_dq(node, state, inits=inits, asymmetric_int4=asymmetric_int4)
        else:
            raise OpError(f"no plugin-free TensorRT lowering for {OP_DOMAIN}::{node.op_type} (node {node.name})")

    out = finish_lowering(rewrite_custom_nodes(model, rewrite))
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < _BLOCKWISE_DQ_OPSET:
            o.version = _BLOCKWISE_DQ_OPSET
    return out
