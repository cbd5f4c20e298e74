"""The ABI of the ``trtpipe`` ops (ONNX domain "trtpipe", version 1): the ops' descriptions in
one table, their ONNX schemas, the TensorRT plugins they lower to, and the hashes an artifact's
manifest records.

:data:`OP_SPECS` maps each op to its description (``ops/<op>/spec.py``, plain data), so
:func:`op_schema_abi_hash` works without onnx installed (the runtime checks a manifest's hash on
the embedded target). :func:`register_schemas` turns the descriptions into ``onnx.defs.OpSchema``
objects with each op's Python type-and-shape inference (``ops/<op>/schema.py``) and registers them
(idempotent), after which ``onnx.checker.check_model`` and
``onnx.shape_inference.infer_shapes(strict_mode=True)`` accept graphs with these nodes.

Besides the contract's attributes, both ops accept the optional string attributes
``plugin_namespace`` / ``plugin_version`` that TensorRT's ONNX parser reads to find the plugin
creator; they do not change the op's meaning.

:func:`plugin_abi_hash` fingerprints the plugin kernels a TensorRT plan embeds: the op schemas'
canonical text and the bytes of :data:`PLUGIN_ABI_SOURCES` (the manifest records it; the
runtime compares). Neither hash imports triton, onnx or tensorrt.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trtpipe.plugins import OP_DOMAIN, OP_VERSION
from trtpipe.plugins.ops.int4_gemm.schema import infer_int4_gemm
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.onnx_schema import build_schema
from trtpipe.plugins.ops.paged_attention.schema import infer_paged_attention
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION
from trtpipe.plugins.ops.spec import OpSpec, PluginSpec

__all__ = [
    "OP_SPECS",
    "PLUGINS",
    "PLUGIN_NAMESPACE",
    "PLUGIN_ATTRIBUTES",
    "register_schemas",
    "infer_trtpipe_shapes",
    "op_schema_abi_hash",
    "op_schema_canonical_text",
    "PLUGIN_ABI_SOURCES",
    "plugin_abi_hash",
]

OP_SPECS: dict[str, OpSpec] = {s.name: s for s in (PAGED_ATTENTION, INT4_GEMM)}
_INFERENCE = {"PagedAttention": infer_paged_attention, "Int4Gemm": infer_int4_gemm}

PLUGIN_NAMESPACE = "trtpipe"
# plugin creator name -> its description; the lowering writes these nodes, trt_plugins registers them
PLUGINS: dict[str, PluginSpec] = {p.name: p for s in OP_SPECS.values() for p in s.plugins}
# plugin creator name -> the attributes its node carries (besides plugin_namespace/version)
PLUGIN_ATTRIBUTES: dict[str, tuple[str, ...]] = {name: p.attribute_names for name, p in PLUGINS.items()}


def op_schema_canonical_text() -> str:
    """Canonical JSON text of the domain, version and both op signatures (inputs, outputs,
    type constraints, attributes with kinds and defaults). Docs and descriptions are left out:
    rewording a docstring does not change the ABI."""
    ops = {name: spec.canonical() for name, spec in sorted(OP_SPECS.items())}
    doc = {"domain": OP_DOMAIN, "version": OP_VERSION, "ops": ops}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def op_schema_abi_hash() -> str:
    """sha256 hex digest of :func:`op_schema_canonical_text`, recorded in the manifest."""
    return hashlib.sha256(op_schema_canonical_text().encode("utf-8")).hexdigest()


def register_schemas() -> None:
    """Register the ``trtpipe`` op schemas with onnx (idempotent; needs onnx >= 1.16)."""
    import onnx.defs

    for name, spec in OP_SPECS.items():
        if not onnx.defs.has(name, OP_DOMAIN):
            onnx.defs.register_schema(build_schema(spec, _INFERENCE[name]))


def infer_trtpipe_shapes(model: Any, strict: bool = True) -> Any:
    """Register the schemas, then return ``onnx.shape_inference.infer_shapes(model,
    check_type=True, strict_mode=strict)``: value_info filled for trtpipe node outputs (and
    everything downstream); type-constraint violations and contradicting static dims raise."""
    import onnx.shape_inference

    register_schemas()
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=strict)


# ------------------------------------------------------------------------------------------------
# plugin ABI: what a TensorRT plan's embedded plugin kernels were built from
# ------------------------------------------------------------------------------------------------

# files (under plugins/) whose bytes define the plugin ABI: the descriptions the plugin signatures
# are built from, kernels, plugin registration, the plugin lowering
PLUGIN_ABI_SOURCES: tuple[str, ...] = (
    "ops/spec.py",
    "ops/paged_attention/spec.py",
    "ops/int4_gemm/spec.py",
    "ops/paged_attention/triton_kernels.py",
    "ops/paged_attention/tiles.py",
    "ops/int4_gemm/triton_kernels.py",
    "ops/trt_kernel_abi.py",
    "ops/trt_kernels.py",
    "ops/paged_attention/trt_kernels.py",
    "ops/int4_gemm/trt_kernels.py",
    "ops/trt_registration.py",
    "ops/trt_plugins.py",
    "ops/paged_attention/trt_plugin.py",
    "ops/int4_gemm/trt_plugin.py",
    "ops/trt_nodes.py",
    "ops/paged_attention/lower_trt.py",
    "ops/int4_gemm/lower_trt.py",
    "lowering/trt.py",
)


def plugin_abi_hash() -> str:
    """sha256 (64 hex chars) over the op schemas (canonical text) and the plugin sources
    (:data:`PLUGIN_ABI_SOURCES`: descriptions, Triton kernels, plugin wrapper kernels, plugin
    registration, TensorRT lowering).

    Recorded in the manifest at build time; the runtime refuses a plan whose plugins came from
    other sources. Reads the files as bytes (a missing one hashes as ``<missing>``): no triton,
    onnx or tensorrt import, so the embedded runtime can compute it.
    """
    from pathlib import Path

    h = hashlib.sha256(op_schema_canonical_text().encode())
    root = Path(__file__).parents[1]  # plugins/
    for name in PLUGIN_ABI_SOURCES:
        p = root / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.is_file() else b"<missing>")
    return h.hexdigest()
