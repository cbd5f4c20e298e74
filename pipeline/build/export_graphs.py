"""Export stage: prepared model -> torch references -> raw prefill/decode ONNX graphs.

One torch reference per weight precision (fp32 or int4; fp16/bf16 phases export fp32 and are
cast when lowered), exported per phase by :func:`trtpipe.pipeline.export.export_phase`. The raw
graphs are loaded into memory and their files removed: lowering works on the in-memory graphs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.pipeline.build.load import PreparedModel
from trtpipe.pipeline.recipe import Recipe

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class ExportedGraphs:
    """Raw exported graphs (``trtpipe`` custom ops, fp32 activations) and the references behind them."""

    graphs: dict[str, Any]  # phase -> onnx.ModelProto (weights in memory)
    references: dict[str, Any]  # weight precision ("fp32" | "int4") -> LlamaReference
    timings_s: dict[str, float]  # export_<phase>_s


def reference_for(recipe: Recipe, model: PreparedModel, weight_precision: str) -> Any:
    """The torch reference of ``model`` at ``weight_precision`` ("fp32" or "int4", the recipe's
    INT4 group size and symmetry), RoPE table up to ``max_seq_len``, the recipe's window override."""
    from trtpipe.pipeline.model import build_reference_model

    int4 = recipe.precision.int4
    return build_reference_model(
        model.loaded,
        weight_precision,
        int4.group_size,
        int4.symmetric,
        rope_table_len=recipe.max_seq_len,
        sliding_window=recipe.sliding_window,
    )


def export_graphs(
    recipe: Recipe,
    model: PreparedModel,
    phases: tuple[str, ...],
    work_dir: Path,
    *,
    weight_precision: Callable[[str], str],
    log: Callable[[str], None] = print,
) -> ExportedGraphs:
    """Export each of ``phases`` from the reference at ``weight_precision(phase precision)``,
    writing and removing ``<phase>.raw.onnx`` (+ ``.data``) under ``work_dir``."""
    import onnx

    from trtpipe.pipeline.export import export_phase

    refs: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for phase in phases:
        prec = getattr(recipe.precision, phase)
        wp = weight_precision(prec)
        if wp not in refs:
            refs[wp] = reference_for(recipe, model, wp)
        log(f"exporting {phase} ({prec}) ...")
        res = export_phase(refs[wp], phase, work_dir / f"{phase}.raw.onnx", recipe.kv_cache.block_size)
        timings[f"export_{phase}_s"] = res.seconds
        t = time.perf_counter()
        graphs[phase] = onnx.load(str(res.path))
        timings[f"read_{phase}_s"] = time.perf_counter() - t
        res.path.unlink()
        (work_dir / (res.path.name + ".data")).unlink(missing_ok=True)
    return ExportedGraphs(graphs, refs, timings)
