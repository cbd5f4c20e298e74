"""Versions trtpipe states, one home each.

``TRTPIPE_VERSION`` is the package version (``pyproject.toml``'s ``version``; a test holds the
two equal). ``TRT_PLUGINS_MIN_VERSION`` is the oldest TensorRT whose Python package has
``tensorrt.plugin`` with ``aot_impl`` (TensorRT 10.7, JetPack 7 on an Orin), which the
``trtpipe::PagedAttention`` / ``trtpipe::Int4Gemm`` plugins need; older TensorRT (10.3 in
JetPack 6) gets the plugin-free graphs or nothing. The plugin ABI hash, which fingerprints the
plugin kernels a TensorRT plan embeds, lives with the ops' ABI
(:func:`trtpipe.plugins.ops.abi.plugin_abi_hash`).
"""

from __future__ import annotations

TRTPIPE_VERSION = "0.1.0"

TRT_PLUGINS_MIN_VERSION: tuple[int, int] = (10, 7)
TRT_PLUGINS_REQUIREMENT = "TensorRT >= 10.7"


def version_tuple(version: str) -> tuple[int, int]:
    """``"10.13.0.35"`` -> ``(10, 13)``. Raises ValueError naming the string when it has no
    ``major.minor`` prefix."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"version {version!r}: expected 'major.minor[...]' (e.g. '10.7.0')") from None


def trt_has_python_plugins(trt_version: str) -> bool:
    """True when TensorRT ``trt_version`` can run trtpipe's Python plugins (>= 10.7)."""
    return version_tuple(trt_version) >= TRT_PLUGINS_MIN_VERSION
