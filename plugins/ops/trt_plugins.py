"""TensorRT plugins of the ``trtpipe`` ops: ``tensorrt.plugin`` registration with AOT Triton kernels.

Plugins (namespace ``trtpipe``, version ``1``; described in ``ops/<op>/spec.py``, registered by
``ops/<op>/trt_plugin.py``, their graph nodes written by ``ops/<op>/lower_trt.py`` through
:func:`trtpipe.plugins.lowering.trt.lower_with_plugins`): PagedKVWrite and PagedAttention
(:mod:`trtpipe.plugins.ops.paged_attention.trt_plugin`), Int4Gemm
(:mod:`trtpipe.plugins.ops.int4_gemm.trt_plugin`).

``register`` describes outputs symbolically; ``aot_impl`` compiles the Triton kernel to PTX at
engine build time, so the plan embeds it and runs without Python (TensorRT >= 10.7);
``autotune`` lists the dtype combinations and, for Int4Gemm and prefill attention, tile
configurations as tactics that TensorRT times per optimization profile (GEMV-shaped tiles win
for decode, wider tiles for prefill).

The wrapper kernels in TensorRT's argument order, their configurations and their AOT
compilation to PTX live in :mod:`trtpipe.plugins.ops.trt_kernels` (re-exported here).

This module imports triton (through the kernels; import it lazily, build side only). Registration
takes the ``tensorrt.plugin`` module as an argument (tests pass one built on ``tensorrt-lean``'s
bindings; TensorRT's own on a GPU box). A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from typing import Any

from trtpipe.plugins import PLUGIN_VERSION
from trtpipe.plugins.core.versions import TRT_PLUGINS_MIN_VERSION, trt_has_python_plugins
from trtpipe.plugins.ops.abi import PLUGIN_ATTRIBUTES, PLUGIN_NAMESPACE
from trtpipe.plugins.ops.int4_gemm.trt_plugin import register_int4_gemm
from trtpipe.plugins.ops.paged_attention.trt_plugin import register_attention, register_kv_write
from trtpipe.plugins.ops.trt_kernels import (
    INT4_TACTICS,
    PREFILL_TACTICS,
    compile_plugin_kernel,
    kernel_config,
    strip_unused_params,
)
from trtpipe.plugins.ops.trt_registration import TARGET_CC

__all__ = [
    "register_plugins",
    "compile_plugin_kernel",
    "kernel_config",
    "strip_unused_params",
    "INT4_TACTICS",
    "PREFILL_TACTICS",
    "trt_version_supports_plugins",
    "PLUGIN_VERSIONS",
    "MIN_TRT_VERSION",
]

MIN_TRT_VERSION = TRT_PLUGINS_MIN_VERSION  # tensorrt.plugin with aot_impl (home: plugins/core/versions.py)
PLUGIN_VERSIONS = {name: PLUGIN_VERSION for name in PLUGIN_ATTRIBUTES}

_REGISTERED: dict[int, dict[str, Any]] = {}  # id(trtp) -> {plugin id: register function}


def trt_version_supports_plugins(version: str) -> bool:
    """True for TensorRT >= 10.7 (``tensorrt.plugin`` with ``aot_impl``); False for a version
    string without ``major.minor``."""
    try:
        return trt_has_python_plugins(version)
    except ValueError:
        return False


def register_plugins(trtp: Any = None, *, cc: int | None = None) -> dict[str, Any]:
    """Register PagedKVWrite, PagedAttention and Int4Gemm with ``tensorrt.plugin`` (idempotent per
    module). ``cc`` (e.g. 80) is the SM the AOT kernels are compiled for (the build target).
    Returns ``{plugin id: register function}``."""
    if trtp is None:
        import tensorrt.plugin as trt_plugin_module  # noqa: PLC0415  (TensorRT >= 10.7)

        trtp = trt_plugin_module
    if cc is not None:
        TARGET_CC["cc"] = int(cc)
    state = _REGISTERED.get(id(trtp))
    if state is not None:
        return state
    import tensorrt as trt

    ns = PLUGIN_NAMESPACE
    ids = {
        f"{ns}::PagedKVWrite": register_kv_write(trtp, trt),
        f"{ns}::PagedAttention": register_attention(trtp, trt),
        f"{ns}::Int4Gemm": register_int4_gemm(trtp, trt),
    }
    _REGISTERED[id(trtp)] = ids
    return ids
