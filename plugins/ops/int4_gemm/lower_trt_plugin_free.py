"""``trtpipe::Int4Gemm`` in TensorRT's plugin-free lowering: blockwise INT4 ``DequantizeLinear`` +
``MatMul`` (TensorRT < 10.7 on JetPack 6, the TensorRT-RTX smoke build; the graph walk is
:func:`trtpipe.plugins.lowering.trt_plugin_free.lower_plugin_free`)::

    W_int4 [K, N] ──DequantizeLinear(axis=0, block_size=G)──► W [K, N] ──► MatMul(A, W) ──► Y
    scale  [K/G, N] ┘

TensorRT's INT4 dequantization is symmetric only (zero point 0 after the -8 shift), so
asymmetric weights (per-block zero points != 8, e.g. GGUF Q4_1) raise :class:`OpError`, or,
when asked (``asymmetric_int4``), are re-quantized to symmetric blocks of the same group size
(least-squares scale per block) or stored dequantized as float weights of a plain ``MatMul``.
``bits=8`` (an 8-bit LM head) becomes a float ``MatMul`` (as in the plugin lowering).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, NodeBuilder, node_attributes
from trtpipe.plugins.ops.int4_gemm.layout import unpack_int4_codes, zero_points_float
from trtpipe.plugins.ops.int4_gemm.lower_float import emit_float_matmul, lower_int8_gemm_float
from trtpipe.plugins.ops.int4_gemm.pack import requantize_symmetric
from trtpipe.plugins.ops.int4_gemm.reference import dequantize_int4

__all__ = ["ASYMMETRIC_INT4_MODES", "lower_int4_gemm_dq"]

ASYMMETRIC_INT4_MODES = ("refuse", "requantize_symmetric", "dequantize_float")


def lower_int4_gemm_dq(
    node: onnx.NodeProto, state: GraphRewrite, *, inits: dict[str, onnx.TensorProto], asymmetric_int4: str = "refuse"
) -> None:
    """Rewrite one ``Int4Gemm`` node, appended to ``state``: 4-bit ->
    ``MatMul(A, DequantizeLinear(W_int4 [K, N], scale [K/G, N], axis=0, block_size=G))``; 8-bit
    (an LM head) -> a float MatMul (:func:`~trtpipe.plugins.ops.int4_gemm.lower_float.lower_int8_gemm_float`). Symmetric only (zero point 8 everywhere), see the module docstring.
    Asymmetric blocks (``asymmetric_int4``): ``refuse`` raises; ``requantize_symmetric``
    re-quantizes them (:func:`~trtpipe.plugins.ops.int4_gemm.pack.requantize_symmetric`, same group size);
    ``dequantize_float`` writes ``MatMul(A, W^T)`` with W dequantized at lowering time (exact up
    to the float rounding; the cast pass then stores it in the activation dtype)."""
    b = NodeBuilder(node.name or node.op_type)
    if int(node_attributes(node).get("bits", 4)) == 8:
        lower_int8_gemm_float(b, node, inits)
    else:
        _lower_dq(b, node, inits, asymmetric_int4)
    state.emit(b)


def _lower_dq(b: NodeBuilder, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], asymmetric_int4: str) -> None:
    """:func:`lower_int4_gemm_dq` of a 4-bit node."""
    a = node_attributes(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    packed, scales, raw_zp = _weights(node, inits)
    zp = zero_points_float(raw_zp, N, K // G)  # [N, K/G] float32, 8 when absent
    if asymmetric_int4 not in ASYMMETRIC_INT4_MODES:
        raise OpError(f"asymmetric_int4 = {asymmetric_int4!r}: expected one of {ASYMMETRIC_INT4_MODES}")
    if not np.all(zp == 8.0):
        if asymmetric_int4 == "dequantize_float":
            emit_float_matmul(b, node, dequantize_int4(packed, scales, raw_zp, K, N, G), scales.dtype)
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
