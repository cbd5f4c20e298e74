"""``trtpipe::Int4Gemm`` as a float ``MatMul`` of weights dequantized at lowering time: the 8-bit
LM head (``bits=8``) in both TensorRT lowerings (neither the Int4Gemm plugin nor TensorRT's block
quantization, INT4/FP8 only, takes 8-bit blocks), and asymmetric INT4 weights in the plugin-free
lowering when asked (``asymmetric_int4="dequantize_float"``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import NodeBuilder, node_attributes
from trtpipe.plugins.ops.int4_gemm.reference import dequantize_int4

__all__ = ["emit_float_matmul", "lower_int8_gemm_float"]


def emit_float_matmul(b: NodeBuilder, node: onnx.NodeProto, w: np.ndarray, dtype: np.dtype) -> None:
    """``Y = MatMul(A, W^T)`` with ``w [N, K]`` stored as a ``[K, N]`` initializer in ``dtype``."""
    name = b.name("w_dequantized")
    b.inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(dtype)), name))  # [K, N]
    b.op("MatMul", [node.input[0], name], "matmul", outputs=list(node.output))


def lower_int8_gemm_float(b: NodeBuilder, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> None:
    """``Int4Gemm`` with ``bits=8`` (an 8-bit LM head, e.g. GGUF Q8_0: codes ``[N, K/G, G]``
    bytes, zero point 128 by default) -> ``MatMul(A, W^T)`` with W dequantized at lowering time
    (:func:`~trtpipe.plugins.ops.int4_gemm.reference.dequantize_int4`, ``bits=8``). Neither the Int4Gemm plugin
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
    emit_float_matmul(b, node, dequantize_int4(codes, scales, zp, K, N, G, bits=8), scales.dtype)
