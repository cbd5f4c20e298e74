"""Lower stage, ONNX Runtime backend (target cpu): fuse, then rewrite ``trtpipe`` nodes to ORT ops.

Per phase: :func:`~trtpipe.pipeline.passes.optimize_for_ort` (RMSNorm, rotary, INT4 sibling
fusions) then :func:`~trtpipe.plugins.lowering.ort.lower_for_ort` (``com.microsoft`` ops;
MatMulNBits with the recipe's accuracy level and zero-point form).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.export import PHASES, ExportedGraphs

ORT_CPU_PRECISIONS = ("fp32", "int4")


@dataclass(frozen=True)
class OrtGraphs:
    """Graphs ONNX Runtime's CPU EP runs, per phase."""

    graphs: dict[str, Any]  # phase -> onnx.ModelProto
    timings_s: dict[str, float]  # lower_<phase>_s, and fused_<phase> (counts of each fusion)


def check_cpu_precisions(recipe: Recipe) -> None:
    """Raises :class:`BuildError` for a phase precision ONNX Runtime's CPU EP does not run."""
    for phase in PHASES:
        prec = getattr(recipe.precision, phase)
        if prec not in ORT_CPU_PRECISIONS:
            raise BuildError(
                f"precision.{phase} = {prec!r} is not supported on target cpu "
                "(ONNX Runtime CPU runs fp32 and int4 weight-only). Fix: use fp32 or int4."
            )


def lower_ort(recipe: Recipe, exported: ExportedGraphs) -> OrtGraphs:
    """Fuse and lower every exported phase for the ONNX Runtime CPU EP."""
    from trtpipe.pipeline.passes import optimize_for_ort
    from trtpipe.plugins.lowering.ort import lower_for_ort

    graphs: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for phase, raw in exported.graphs.items():
        t = time.perf_counter()
        model, fused = optimize_for_ort(raw)
        graphs[phase] = lower_for_ort(
            model,
            accuracy_level=recipe.engine.accuracy_level(phase),
            decode=phase == "decode",
            float_zero_points=recipe.engine.ort_float_zero_points,
            split_decode_rows=phase == "prefill" and recipe.engine.ort_fused_steps,
            kv_dtype=recipe.kv_dtype,
        )
        timings[f"fused_{phase}"] = fused
        timings[f"lower_{phase}_s"] = time.perf_counter() - t
    return OrtGraphs(graphs, timings)
