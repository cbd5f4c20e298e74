"""Versions trtpipe states, one home each.

``TRTPIPE_VERSION`` is the package version (``pyproject.toml``'s ``version``; a test holds the
two equal). ``TRT_PLUGINS_MIN_VERSION`` is the oldest TensorRT whose Python package has
``tensorrt.plugin`` with ``aot_impl`` (TensorRT 10.7, JetPack 7 on an Orin), which the
``trtpipe::PagedAttention`` / ``trtpipe::Int4Gemm`` plugins need; older TensorRT (10.3 in
JetPack 6) gets the plugin-free graphs or nothing. :func:`plugin_abi_hash` fingerprints the
plugin kernels a TensorRT plan embeds (the manifest records it; the runtime compares).
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


# ------------------------------------------------------------------------------------------------
# plugin ABI: what a TensorRT plan's embedded plugin kernels were built from
# ------------------------------------------------------------------------------------------------

# files (under plugins/) whose bytes define the plugin ABI: kernels, registration, plugin lowering
PLUGIN_ABI_SOURCES: tuple[str, ...] = (
    "ops/paged_attention/triton_kernels.py",
    "ops/trt_kernels.py",
    "ops/trt_plugins.py",
    "lowering/trt.py",
)


def plugin_abi_hash() -> str:
    """sha256 (64 hex chars) over the op schemas (canonical text) and the plugin sources
    (:data:`PLUGIN_ABI_SOURCES`: Triton kernels, plugin wrapper kernels, plugin registration,
    TensorRT lowering).

    Recorded in the manifest at build time; the runtime refuses a plan whose plugins came from
    other sources. Reads the files as bytes (a missing one hashes as ``<missing>``): no triton,
    onnx or tensorrt import, so the embedded runtime can compute it.
    """
    import hashlib
    from pathlib import Path

    from trtpipe.plugins.ops.abi import op_schema_canonical_text

    h = hashlib.sha256(op_schema_canonical_text().encode())
    root = Path(__file__).parents[1]  # plugins/
    for name in PLUGIN_ABI_SOURCES:
        p = root / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.is_file() else b"<missing>")
    return h.hexdigest()
