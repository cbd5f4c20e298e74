"""Lower exported ``trtpipe`` graphs for TensorRT's ONNX parser.

Passes (each ``ModelProto -> ModelProto``, returning a new model; idempotent):

* :func:`~trtpipe.plugins.graph.float_cast.cast_float_graph` -- fp32 graphs to fp16 / bf16
  activations, RMSNorm statistics kept fp32 (:mod:`trtpipe.plugins.graph.float_cast`).
* :func:`lower_with_plugins` -- custom nodes become TensorRT plugin nodes (op type = plugin
  creator name, attributes ``plugin_namespace`` / ``plugin_version``, see TOOLCHAIN.md). A
  Python AOT plugin launches exactly one kernel, so ``PagedAttention`` (write-then-attend) is
  split into two plugin nodes::

      key, value, key_cache, value_cache, slot_mapping
            │
      PagedKVWrite ──► key_cache_out, value_cache_out   (aliased to the inputs: in place)
            │
      query ─┴► PagedAttention(decode=0|1) ──► output     (reads the updated pool)

  ``decode=1`` (the split layout's decode graph: one token per sequence) selects the decode
  kernel; ``decode=0`` the ragged prefill kernel. ``Int4Gemm`` keeps its node; zero points are
  always given as a float tensor (uint8 zero points are unpacked, absent ones become 8), so the
  plugin has one fixed signature. ``Int4Gemm`` with ``bits=8`` (an 8-bit LM head) becomes a
  float ``MatMul`` in both lowerings (no 8-bit block kernel or TensorRT block format).
* :func:`~trtpipe.plugins.lowering.trt_plugin_free.lower_plugin_free` -- no custom node left (TensorRT
  < 10.7 on JetPack 6, the TensorRT-RTX smoke build; :mod:`trtpipe.plugins.lowering.trt_plugin_free`).

:func:`lower_for_trt` composes them for one graph. The node walk is
:func:`trtpipe.plugins.graph.rewrite.rewrite_custom_nodes`, shared with the ONNX Runtime lowering.
This file is one of the plugin ABI sources (:data:`trtpipe.plugins.core.versions.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtpipe.plugins import OP_DOMAIN, PLUGIN_VERSION
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.float_cast import FLOAT_TYPES, cast_float_graph
from trtpipe.plugins.graph.rewrite import (
    GraphRewrite,
    NodeBuilder,
    finish_lowering,
    node_attributes,
    rewrite_custom_nodes,
)
from trtpipe.plugins.lowering.trt_plugin_free import ASYMMETRIC_INT4_MODES, lower_int8_gemm_float, lower_plugin_free
from trtpipe.plugins.ops.int4_gemm.pack import unpack_zero_points_uint8

__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_ATTRIBUTES",
    "lower_with_plugins",
    "lower_for_trt",
    "custom_nodes",
    # re-exported from their homes (float_cast.py, trt_plugin_free.py)
    "FLOAT_TYPES",
    "cast_float_graph",
    "ASYMMETRIC_INT4_MODES",
    "lower_plugin_free",
]

PLUGIN_NAMESPACE = "trtpipe"
# plugin creator name -> the attributes its node carries (besides plugin_namespace/version);
# trt_plugins.py registers exactly these.
PLUGIN_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "PagedKVWrite": ("num_kv_heads", "head_size", "block_size"),
    "PagedAttention": ("num_heads", "num_kv_heads", "head_size", "scale", "block_size", "sliding_window", "decode"),
    "Int4Gemm": ("K", "N", "group_size", "bits"),
}


def _plugin_node(
    op_type: str, inputs: list[str], outputs: list[str], name: str, attrs: dict, namespace: str, version: str
) -> onnx.NodeProto:
    want = PLUGIN_ATTRIBUTES[op_type]
    kw = {k: attrs[k] for k in want}
    return helper.make_node(
        op_type, inputs, outputs, name=name, domain=OP_DOMAIN, plugin_namespace=namespace, plugin_version=version, **kw
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
    a = node_attributes(node)
    base = node.name or node.output[0]
    if node.op_type == "PagedAttention":
        q, k, v, kc, vc, slot, bt, cl, qsl = node.input[:9]
        o, kc_out, vc_out = node.output
        state.nodes.append(
            _plugin_node(
                "PagedKVWrite", [k, v, kc, vc, slot], [kc_out, vc_out], f"{base}/kv_write", a, namespace, version
            )
        )
        a = {
            **a,
            "scale": float(a.get("scale", 0.0)),
            "sliding_window": int(a.get("sliding_window", 0)),
            "decode": int(decode),
        }
        state.nodes.append(
            _plugin_node(
                "PagedAttention", [q, kc_out, vc_out, bt, cl, qsl], [o], f"{base}/attention", a, namespace, version
            )
        )
    elif node.op_type == "Int4Gemm" and int(a.get("bits", 4)) == 8:
        b = NodeBuilder(base)
        lower_int8_gemm_float(b, node, inits)
        state.emit(b)
    elif node.op_type == "Int4Gemm":
        K, N, G = a["K"], a["N"], a["group_size"]
        zp = _float_zero_points(node, inits, state.initializers, K // G, N)
        a = {**a, "bits": int(a.get("bits", 4))}
        state.nodes.append(
            _plugin_node("Int4Gemm", list(node.input[:3]) + [zp], list(node.output), base, a, namespace, version)
        )
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
