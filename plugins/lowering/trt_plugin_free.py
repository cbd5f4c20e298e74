"""TensorRT's plugin-free lowering: every ``trtpipe`` node in standard ONNX ops.

For TensorRT < 10.7 (JetPack 6) and the TensorRT-RTX smoke build, which have no Python AOT
plugins. ``PagedAttention`` is the standard-op attention shared with the ONNX Runtime lowering
(:mod:`trtpipe.plugins.ops.paged_attention.lower_onnx`: ``ScatterND`` write, ``Gather`` by block table,
causal + window masks); ``Int4Gemm`` is blockwise INT4 ``DequantizeLinear`` + ``MatMul``::

    W_int4 [K, N] ──DequantizeLinear(axis=0, block_size=G)──► W [K, N] ──► MatMul(A, W) ──► Y
    scale  [K/G, N] ┘

TensorRT's INT4 dequantization is symmetric only (zero point 0 after the -8 shift), so
asymmetric weights (per-block zero points != 8, e.g. GGUF Q4_1) raise :class:`OpError`, or,
when asked (``asymmetric_int4``), are re-quantized to symmetric blocks of the same group size
(least-squares scale per block) or stored dequantized as float weights of a plain ``MatMul``.
``Int4Gemm`` with ``bits=8`` (an 8-bit LM head) becomes a float ``MatMul`` (also in the plugin
lowering: no 8-bit block kernel or TensorRT block format).

Cost of going plugin-free: TensorRT's ``ScatterND`` writes a new output tensor, so each step
copies every layer's pool (the plugin writes in place); attention reads ``MB * block_size``
keys per sequence. Fine for a smoke build and small pools; the plugins are the fast path.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import (
    GraphRewrite,
    NodeBuilder,
    finish_lowering,
    node_attributes,
    rewrite_custom_nodes,
)
from trtpipe.plugins.ops.int4_gemm.pack import requantize_symmetric, unpack_int4_codes, zero_points_float
from trtpipe.plugins.ops.paged_attention.lower_onnx import lower_paged_attention
from trtpipe.plugins.ops.paged_attention.reference import dequantize_int4

__all__ = ["ASYMMETRIC_INT4_MODES", "lower_plugin_free", "lower_int8_gemm_float"]

ASYMMETRIC_INT4_MODES = ("refuse", "requantize_symmetric", "dequantize_float")
_BLOCKWISE_DQ_OPSET = 21  # blockwise DequantizeLinear (block_size attribute)


def lower_plugin_free(
    model: onnx.ModelProto, *, decode: bool = False, asymmetric_int4: str = "refuse"
) -> onnx.ModelProto:
    """Rewrite every ``trtpipe`` node into standard ONNX ops TensorRT parses without plugins.

    ``decode``: one query token per sequence (the split layout's decode graph), which takes the
    decode-specialized attention (no padded query layout).
    ``asymmetric_int4``: what asymmetric INT4 weights become (see :func:`_lower_int4_gemm_dq`):
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
            return
        b = NodeBuilder(node.name or node.op_type)
        if node.op_type == "Int4Gemm" and int(node_attributes(node).get("bits", 4)) == 8:
            lower_int8_gemm_float(b, node, inits)
        elif node.op_type == "Int4Gemm":
            _lower_int4_gemm_dq(b, node, inits, asymmetric_int4=asymmetric_int4)
        else:
            raise OpError(f"no plugin-free TensorRT lowering for {OP_DOMAIN}::{node.op_type} (node {node.name})")
        state.emit(b)

    out = finish_lowering(rewrite_custom_nodes(model, rewrite))
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < _BLOCKWISE_DQ_OPSET:
            o.version = _BLOCKWISE_DQ_OPSET
    return out


def _int4_tensor(values: np.ndarray, name: str) -> onnx.TensorProto:
    """Signed INT4 initializer from int values in [-8, 7] (ONNX packs two per byte, low nibble
    first, in row-major order)."""
    import ml_dtypes

    return numpy_helper.from_array(np.ascontiguousarray(values.astype(np.int8)).astype(ml_dtypes.int4), name)


def _weights(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(codes, scales, zero points or None)`` of an ``Int4Gemm`` node as stored. Raises
    :class:`OpError` when one is not an initializer."""
    zp_name = node.input[3] if len(node.input) > 3 else ""
    try:
        arrays = [numpy_helper.to_array(inits[name]) for name in node.input[1:3]]
        zp = numpy_helper.to_array(inits[zp_name]) if zp_name else None
    except KeyError as e:
        raise OpError(
            f"Int4Gemm {node.name}: {e} must be an initializer (load the graph with its external data before lowering)"
        ) from None
    return arrays[0], arrays[1], zp


def _emit_float_matmul(b: NodeBuilder, node: onnx.NodeProto, w: np.ndarray, dtype: np.dtype) -> None:
    """``Y = MatMul(A, W^T)`` with ``w [N, K]`` stored as a ``[K, N]`` initializer in ``dtype``."""
    name = b.name("w_dequantized")
    b.inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(dtype)), name))  # [K, N]
    b.op("MatMul", [node.input[0], name], "matmul", outputs=list(node.output))


def _lower_int4_gemm_dq(
    b: NodeBuilder, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], *, asymmetric_int4: str = "refuse"
) -> None:
    """``Int4Gemm`` -> ``MatMul(A, DequantizeLinear(W_int4 [K, N], scale [K/G, N], axis=0,
    block_size=G))``. Symmetric only (zero point 8 everywhere), see the module docstring.
    Asymmetric blocks (``asymmetric_int4``): ``refuse`` raises; ``requantize_symmetric``
    re-quantizes them (:func:`~trtpipe.plugins.ops.int4_gemm.pack.requantize_symmetric`, same group size);
    ``dequantize_float`` writes ``MatMul(A, W^T)`` with W dequantized at lowering time (exact up
    to the float rounding; the cast pass then stores it in the activation dtype)."""
    a = node_attributes(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    packed, scales, raw_zp = _weights(node, inits)
    zp = zero_points_float(raw_zp, N, K // G)  # [N, K/G] float32, 8 when absent
    if asymmetric_int4 not in ASYMMETRIC_INT4_MODES:
        raise OpError(f"asymmetric_int4 = {asymmetric_int4!r}: expected one of {ASYMMETRIC_INT4_MODES}")
    if not np.all(zp == 8.0):
        if asymmetric_int4 == "dequantize_float":
            _emit_float_matmul(b, node, dequantize_int4(packed, scales, raw_zp, K, N, G), scales.dtype)
            return
        if asymmetric_int4 != "requantize_symmetric":
            raise _asymmetric_error(node, K, N, G, int(np.sum(zp != 8.0)), zp.size)
        packed, sym_scales = requantize_symmetric(packed, scales, raw_zp, K, N, G)
        scales = sym_scales.astype(scales.dtype)
    codes = unpack_int4_codes(packed, K, N, G).astype(np.int16) - 8  # [N, K] in [-8, 7]
    w = b.name("w_int4")
    s = b.name("w_scale")
    b.inits.append(_int4_tensor(codes.T, w))  # [K, N]
    b.inits.append(numpy_helper.from_array(np.ascontiguousarray(scales.T), s))  # [K/G, N], scales' dtype
    dq = b.op("DequantizeLinear", [w, s], "dequantize", axis=0, block_size=G)
    b.op("MatMul", [node.input[0], dq], "matmul", outputs=list(node.output))


def _asymmetric_error(node: onnx.NodeProto, K: int, N: int, G: int, bad: int, total: int) -> OpError:
    return OpError(
        f"Int4Gemm {node.name} (output {node.output[0]}, K={K}, N={N}, group_size={G}) has asymmetric INT4 "
        f"weights ({bad} of {total} blocks have a zero point other than 8), and TensorRT's INT4 DequantizeLinear "
        "is symmetric only, so the plugin-free lowering cannot express them. Fix: use the Int4Gemm plugin "
        "(engine.plugin_free: false, TensorRT >= 10.7), or let the plugin-free variant re-quantize them "
        "symmetrically (engine.plugin_free_int4: requantize_symmetric) or store them dequantized in fp16 "
        "(engine.plugin_free_int4: dequantize_float), gated by "
        "validate.correctness.plugin_free_teacher_forced_agreement_min), or re-quantize every variant "
        "(precision.int4.symmetric: true; a GGUF Q4_1 file is asymmetric and is repacked as is at group_size "
        "32, so pick group_size 64 or 128 to re-quantize), or run that phase in fp16."
    )


def lower_int8_gemm_float(b: NodeBuilder, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> None:
    """``Int4Gemm`` with ``bits=8`` (an 8-bit LM head, e.g. GGUF Q8_0: codes ``[N, K/G, G]``
    bytes, zero point 128 by default) -> ``MatMul(A, W^T)`` with W dequantized at lowering time
    (:func:`~trtpipe.plugins.ops.paged_attention.reference.dequantize_int4`, ``bits=8``). Neither the Int4Gemm plugin
    nor TensorRT's block quantization (INT4/FP8 only) takes 8-bit blocks; a float weight is exact
    up to the float rounding of ``(q - zp) * scale``. Used by both TensorRT lowerings."""
    a = node_attributes(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    try:
        codes = numpy_helper.to_array(inits[node.input[1]]).reshape(N, K // G, G)
        scales = numpy_helper.to_array(inits[node.input[2]])
    except KeyError as e:
        raise OpError(f"Int4Gemm {node.name} (bits=8): {e} must be an initializer") from None
    zp_name = node.input[3] if len(node.input) > 3 else ""
    zp = numpy_helper.to_array(inits[zp_name]) if zp_name else None
    _emit_float_matmul(b, node, dequantize_int4(codes, scales, zp, K, N, G, bits=8), scales.dtype)
