"""The TensorRT plugin nodes a lowering writes: op type = the plugin creator name, domain
``trtpipe``, the fields of its :class:`~trtpipe.plugins.ops.spec.PluginSpec` (and only those) as
attributes, plus ``plugin_namespace`` / ``plugin_version``, which TensorRT's ONNX parser reads to
find the creator (TOOLCHAIN.md). A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.ops.spec import PluginSpec

__all__ = ["plugin_node"]


def plugin_node(
    plugin: PluginSpec,
    inputs: list[str],
    outputs: list[str],
    name: str,
    attrs: dict[str, Any],
    *,
    namespace: str,
    version: str,
) -> onnx.NodeProto:
    """One plugin node; ``attrs`` may hold more than the plugin's fields (they are picked by name)."""
    kw = {k: attrs[k] for k in plugin.attribute_names}
    return helper.make_node(
        plugin.name,
        inputs,
        outputs,
        name=name,
        domain=OP_DOMAIN,
        plugin_namespace=namespace,
        plugin_version=version,
        **kw,
    )
