"""Lower stage, TensorRT backend (targets orin, a100, h200): per phase and lowering variant.

``plugins``: ``trtpipe`` nodes stay for the TensorRT plugins (TensorRT >= 10.7); ``plugin_free``:
standard ops only (any TensorRT 10.x, JetPack 6 included), which refuses asymmetric INT4 unless
``engine.plugin_free_int4`` re-quantizes or dequantizes them. Then the float cast to the phase's
activation dtype. An Orin recipe with ``engine.orin_trt_lt_10_7: plugin_free`` lowers both.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.export import ExportedGraphs
from trtpipe.pipeline.stages.tensorrt.spec import GraphSpec


@dataclass(frozen=True)
class LoweredGraph:
    """One lowered graph with what the profiles need from it."""

    model: Any  # onnx.ModelProto
    spec: GraphSpec
    input_dims: list[tuple[str, list]]  # (input name, dims: ints or dim_param names)
    input_types: dict[str, int]  # input name -> ONNX element type


@dataclass(frozen=True)
class TrtGraphs:
    """Every graph that lowered, keyed ``<phase>`` (first variant) or ``<phase>.<variant>``."""

    variants: tuple[str, ...]  # asked for, in order (the first one unsuffixed)
    graphs: dict[str, LoweredGraph]
    variant_errors: dict[str, str]  # variant -> why it failed (its graphs are dropped)
    timings_s: dict[str, float]

    def key(self, phase: str, variant: str) -> str:
        return phase if variant == self.variants[0] else f"{phase}.{variant}"


def variants_for(recipe: Recipe) -> tuple[str, ...]:
    """The lowerings the recipe asks for: plugin_free or plugins, plus plugin_free on an Orin
    that may run TensorRT < 10.7 (``engine.orin_trt_lt_10_7: plugin_free``)."""
    eng = recipe.engine
    if eng.plugin_free:
        return ("plugin_free",)
    if recipe.target == "orin" and eng.orin_trt_lt_10_7 == "plugin_free":
        return ("plugins", "plugin_free")
    return ("plugins",)


def graph_io(model: Any) -> tuple[list[tuple[str, list]], dict[str, int]]:
    """(input name, dims) and input name -> ONNX element type of a graph."""
    ins, types = [], {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
        ins.append((vi.name, dims))
        types[vi.name] = vi.type.tensor_type.elem_type
    return ins, types


def _lower_one(recipe: Recipe, raw: Any, phase: str, variant: str, key: str) -> LoweredGraph:
    from trtpipe.plugins.lowering.trt import custom_nodes, lower_for_trt

    plugin_free = variant == "plugin_free"
    asymmetric_int4 = recipe.engine.plugin_free_int4 if plugin_free else "refuse"
    m = lower_for_trt(
        raw,
        dtype=recipe.activation_dtype(phase),
        plugin_free=plugin_free,
        decode=phase == "decode",
        kv_dtype=recipe.kv_dtype,
        asymmetric_int4=asymmetric_int4,
    )
    ins, types = graph_io(m)
    spec = GraphSpec(
        f"{key}.onnx",
        phase,
        getattr(recipe.precision, phase),
        recipe.activation_dtype(phase),
        variant,
        phase == "decode",
        tuple(n for n, _ in ins),
        tuple(o.name for o in m.graph.output),
        tuple(sorted({op for op, _ in custom_nodes(m)})),
    )
    return LoweredGraph(m, spec, ins, types)


def lower_trt(recipe: Recipe, exported: ExportedGraphs, *, log: Callable[[str], None] = print) -> TrtGraphs:
    """Lower every exported phase for each variant. Raises :class:`BuildError` when the first
    variant fails; a failure of the second is recorded in ``variant_errors`` and its graphs dropped
    (a variant is usable only if every phase lowered)."""
    from trtpipe.plugins.core.errors import OpError

    variants = variants_for(recipe)
    out = TrtGraphs(variants, {}, {}, {})
    for phase, raw in exported.graphs.items():
        for variant in variants:
            key = out.key(phase, variant)
            t = time.perf_counter()
            try:
                out.graphs[key] = _lower_one(recipe, raw, phase, variant, key)
            except OpError as e:
                if variant == variants[0]:
                    raise BuildError(f"lowering the {phase} graph for TensorRT ({variant}): {e}") from None
                out.variant_errors[variant] = f"{phase}: {e}"
                log(f"  {variant} variant of {phase} not available: {e}")
                continue
            out.timings_s[f"lower_{key}_s"] = time.perf_counter() - t
    for variant in out.variant_errors:
        drop_variant(out, variant)
    return out


def drop_variant(graphs: TrtGraphs, variant: str) -> None:
    """Remove a (second) variant's graphs."""
    for k in [k for k in graphs.graphs if k.endswith(f".{variant}")]:
        del graphs.graphs[k]


def _initializer_bytes(model: Any) -> dict[str, tuple[str, int]]:
    """name -> (sha256 of the bytes, size) of a graph's initializers."""
    from onnx import numpy_helper

    out = {}
    for t in model.graph.initializer:
        raw = t.raw_data or numpy_helper.to_array(t).tobytes()
        out[t.name] = (hashlib.sha256(raw).hexdigest(), len(raw))
    return out


def duplicated_weight_bytes(models: dict[str, Any]) -> int:
    """Bytes of initializers (same name and bytes) that the prefill and decode graphs both hold:
    what the split layout stores twice on the GPU."""
    if "prefill" not in models or "decode" not in models:
        return 0
    a, b = _initializer_bytes(models["prefill"]), _initializer_bytes(models["decode"])
    return sum(size for name, (digest, size) in a.items() if b.get(name, (None,))[0] == digest)
