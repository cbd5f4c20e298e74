"""``trtpipe::PagedAttention`` for TensorRT with plugins: a Python AOT plugin launches exactly one
kernel, so the node (write-then-attend) becomes two plugin nodes (the plugins of
:data:`~trtpipe.plugins.ops.paged_attention.spec.PAGED_ATTENTION`)::

      key, value, key_cache, value_cache, slot_mapping
            │
      PagedKVWrite ──► key_cache_out, value_cache_out   (aliased to the inputs: in place)
            │
      query ─┴► PagedAttention(decode=0|1) ──► output     (reads the updated pool)

``decode=1`` (the split layout's decode graph: one token per sequence) selects the decode kernel;
``decode=0`` the ragged prefill kernel. The graph walk is
:func:`trtpipe.plugins.lowering.trt.lower_with_plugins`. A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

import onnx

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, node_attributes
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION
from trtpipe.plugins.ops.trt_nodes import plugin_node

__all__ = ["plugin_nodes"]


def plugin_nodes(node: onnx.NodeProto, state: GraphRewrite, *, decode: bool, namespace: str, version: str) -> None:
    """Append the node's PagedKVWrite and PagedAttention plugin nodes to ``state``."""
    a = node_attributes(node)
    base = node.name or node.output[0]
    q, k, v, kc, vc, slot, bt, cl, qsl = node.input[:9]
    if any(node.input[9:]):
        raise OpError(
            f"PagedAttention {base}: an int8 KV pool (key_scale/value_scale inputs) has no TensorRT plugin yet; "
            "use kv_cache.dtype fp16 or bf16 on GPU targets"
        )
    o, kc_out, vc_out = node.output[:3]  # the exporter may name the unused optional scale outputs
    ns = dict(namespace=namespace, version=version)
    write, attend = PAGED_ATTENTION.plugin("PagedKVWrite"), PAGED_ATTENTION.plugin("PagedAttention")
    state.nodes.append(plugin_node(write, [k, v, kc, vc, slot], [kc_out, vc_out], f"{base}/kv_write", a, **ns))
    a = {
        **a,
        "scale": float(a.get("scale", 0.0)),
        "sliding_window": int(a.get("sliding_window", 0)),
        "decode": int(decode),
    }
    state.nodes.append(plugin_node(attend, [q, kc_out, vc_out, bt, cl, qsl], [o], f"{base}/attention", a, **ns))
