"""``trtpipe::Int4Gemm`` for TensorRT with plugins: the node keeps its place as an ``Int4Gemm``
plugin node whose zero points are always a float tensor (uint8 zero points are unpacked, absent
ones become 8), so the plugin has one fixed signature
(:data:`~trtpipe.plugins.ops.int4_gemm.spec.INT4_GEMM`'s plugin). ``bits=8`` (an 8-bit LM head)
becomes a float ``MatMul`` (:mod:`trtpipe.plugins.ops.int4_gemm.lower_float`: no 8-bit block
kernel or TensorRT block format). The graph walk is
:func:`trtpipe.plugins.lowering.trt.lower_with_plugins`. A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, NodeBuilder, node_attributes
from trtpipe.plugins.ops.int4_gemm.layout import unpack_zero_points_uint8
from trtpipe.plugins.ops.int4_gemm.lower_float import lower_int8_gemm_float
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.trt_nodes import plugin_node

__all__ = ["plugin_nodes"]


def plugin_nodes(
    node: onnx.NodeProto, state: GraphRewrite, *, inits: dict[str, onnx.TensorProto], namespace: str, version: str
) -> None:
    """Append the node's ``Int4Gemm`` plugin node (or, for ``bits=8``, a float MatMul) to ``state``."""
    a = node_attributes(node)
    base = node.name or node.output[0]
    if int(a.get("bits", 4)) == 8:
        b = NodeBuilder(base)
        lower_int8_gemm_float(b, node, inits)
        state.emit(b)
        return
    K, N, G = a["K"], a["N"], a["group_size"]
    zp = _float_zero_points(node, inits, state.initializers, K // G, N)
    a = {**a, "bits": int(a.get("bits", 4))}
    plugin = INT4_GEMM.plugin("Int4Gemm")
    state.nodes.append(
        plugin_node(
            plugin, list(node.input[:3]) + [zp], list(node.output), base, a, namespace=namespace, version=version
        )
    )


def _float_zero_points(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], extra: list, n_groups: int, N: int
) -> str:
    """The node's zero points as a float initializer name (scales' dtype): a float initializer
    as is, uint8 ones unpacked, absent ones 8 (new initializers are appended to ``extra``)."""
    scales = inits.get(node.input[2])
    if scales is None:
        raise OpError(
            f"Int4Gemm {node.name}: scales {node.input[2]!r} must be an initializer (weights are "
            "constant). Fix: export with the weights as initializers."
        )
    fdt = numpy_helper.to_array(scales).dtype
    zp_name = node.input[3] if len(node.input) > 3 else ""
    if not zp_name:
        zp = np.full((N, n_groups), 8, fdt)
    else:
        t = inits.get(zp_name)
        if t is None:
            raise OpError(f"Int4Gemm {node.name}: zero_points {zp_name!r} must be an initializer")
        if t.data_type != TensorProto.UINT8:
            return zp_name
        zp = unpack_zero_points_uint8(numpy_helper.to_array(t), N, n_groups).astype(fdt)
    name = f"{node.name or node.output[0]}/zero_points_float"
    extra.append(numpy_helper.from_array(zp, name))
    return name
