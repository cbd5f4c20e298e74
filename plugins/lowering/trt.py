"""Lower exported ``trtpipe`` graphs for TensorRT's ONNX parser.

Passes (each ``ModelProto -> ModelProto``, returning a new model; idempotent):

* :func:`~trtpipe.plugins.graph.float_cast.cast_float_graph` -- fp32 graphs to fp16 / bf16
  activations, RMSNorm statistics kept fp32 (:mod:`trtpipe.plugins.graph.float_cast`).
* :func:`lower_with_plugins` -- custom nodes become TensorRT plugin nodes (op type = plugin
  creator name, attributes ``plugin_namespace`` / ``plugin_version``, see TOOLCHAIN.md), each
  through its op's lowering: ``PagedAttention`` -> ``PagedKVWrite`` + ``PagedAttention(decode=0|1)``
  (:mod:`trtpipe.plugins.ops.paged_attention.lower_trt`: a Python AOT plugin launches exactly one
  kernel), ``Int4Gemm`` -> an ``Int4Gemm`` plugin node with float zero points, or a float
  ``MatMul`` for ``bits=8`` (:mod:`trtpipe.plugins.ops.int4_gemm.lower_trt`).
* :func:`~trtpipe.plugins.lowering.trt_plugin_free.lower_plugin_free` -- no custom node left (TensorRT
  < 10.7 on JetPack 6, the TensorRT-RTX smoke build; :mod:`trtpipe.plugins.lowering.trt_plugin_free`).

:func:`lower_for_trt` composes them for one graph. The node walk is
:func:`trtpipe.plugins.graph.rewrite.rewrite_custom_nodes`, shared with the ONNX Runtime lowering.
This file is one of the plugin ABI sources (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

import onnx

from trtpipe.plugins import OP_DOMAIN, PLUGIN_VERSION
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.float_cast import FLOAT_TYPES, cast_float_graph
from trtpipe.plugins.graph.rewrite import GraphRewrite, finish_lowering, node_attributes, rewrite_custom_nodes
from trtpipe.plugins.lowering.trt_plugin_free import ASYMMETRIC_INT4_MODES, lower_plugin_free
from trtpipe.plugins.ops.abi import PLUGIN_ATTRIBUTES, PLUGIN_NAMESPACE
from trtpipe.plugins.ops.int4_gemm import lower_trt as int4_gemm_trt
from trtpipe.plugins.ops.paged_attention import lower_trt as paged_attention_trt

__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_ATTRIBUTES",
    "lower_with_plugins",
    "lower_for_trt",
    "custom_nodes",
    # re-exported from their homes (ops/abi.py, graph/float_cast.py, lowering/trt_plugin_free.py)
    "FLOAT_TYPES",
    "cast_float_graph",
    "ASYMMETRIC_INT4_MODES",
    "lower_plugin_free",
]


def _plugin_nodes(
    node: onnx.NodeProto,
    state: GraphRewrite,
    inits: dict[str, onnx.TensorProto],
    *,
    decode: bool,
    namespace: str,
    version: str,
) -> None:
    """One custom node -> its plugin node(s) (or, for an 8-bit ``Int4Gemm``, a float MatMul)."""
    if node.op_type == "PagedAttention":
        paged_attention_trt.plugin_nodes(node, state, decode=decode, namespace=namespace, version=version)
    elif node.op_type == "Int4Gemm":
        int4_gemm_trt.plugin_nodes(node, state, inits=inits, namespace=namespace, version=version)
    else:
        raise OpError(
            f"no TensorRT plugin for {OP_DOMAIN}::{node.op_type} (node {node.name}); "
            f"plugins exist for {sorted(PLUGIN_ATTRIBUTES)}"
        )


def lower_with_plugins(
    model: onnx.ModelProto, *, decode: bool = False, namespace: str = PLUGIN_NAMESPACE, version: str = PLUGIN_VERSION
) -> onnx.ModelProto:
    """Rewrite ``trtpipe`` nodes into TensorRT plugin nodes (see the module docstring).

    ``decode``: the graph has one query token per sequence (the split layout's decode graph), so
    attention uses the decode kernel. Idempotent: plugin nodes already carrying
    ``plugin_namespace`` are left alone. Raises :class:`OpError` for an unknown ``trtpipe`` op.
    """
    inits = {t.name: t for t in model.graph.initializer}
    out = rewrite_custom_nodes(
        model,
        lambda node, state: _plugin_nodes(node, state, inits, decode=decode, namespace=namespace, version=version),
        keep=lambda node: "plugin_namespace" in node_attributes(node),
    )
    return finish_lowering(out, keep_custom_opset=True)


def lower_for_trt(
    model: onnx.ModelProto,
    *,
    dtype: str,
    plugin_free: bool,
    decode: bool = False,
    kv_dtype: str | None = None,
    asymmetric_int4: str = "refuse",
) -> onnx.ModelProto:
    """The whole TensorRT lowering of one exported fp32 graph: custom ops (plugins or
    plugin-free, the latter optionally re-quantizing asymmetric INT4 weights), then the float
    cast to ``dtype`` ("fp32" | "fp16" | "bf16")."""
    lowered = (
        lower_plugin_free(model, decode=decode, asymmetric_int4=asymmetric_int4)
        if plugin_free
        else lower_with_plugins(model, decode=decode)
    )
    return cast_float_graph(lowered, dtype, kv_dtype=kv_dtype)


def custom_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(op_type, name)`` of every node in the ``trtpipe`` domain (empty after plugin-free lowering)."""
    return [(n.op_type, n.name) for n in model.graph.node if n.domain == OP_DOMAIN]
