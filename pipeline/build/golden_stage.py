"""Golden stage: the reference's greedy outputs that ``trtpipe validate`` compares engines with.

Recorded once per model content and reused across builds and targets (see
:mod:`trtpipe.pipeline.golden` for the cache key); written as ``golden.json`` into the folder
being built.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtpipe.pipeline.build.export_graphs import ExportedGraphs, reference_for
from trtpipe.pipeline.build.load import PreparedModel
from trtpipe.pipeline.golden import golden_for_build
from trtpipe.pipeline.recipe import Recipe

GOLDEN_FILE = "golden.json"


def write_golden(
    recipe: Recipe,
    model: PreparedModel,
    exported: ExportedGraphs,
    artifact_root: Path,
    out_dir: Path,
    *,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any], float]:
    """Write ``out_dir/golden.json`` (``validate.correctness.num_tokens`` tokens per prompt) from the
    cache under ``artifact_root`` or a new recording with the fp32 reference (reused from the
    export when it made one). Returns (golden, seconds)."""
    t = time.perf_counter()
    golden, _ = golden_for_build(
        model.loaded,
        recipe.sliding_window,
        recipe.validation.correctness.num_tokens,
        lambda: exported.references.get("fp32") or reference_for(recipe, model, "fp32"),
        Path(artifact_root),
        log=log,
    )
    (out_dir / GOLDEN_FILE).write_text(json.dumps(golden), encoding="utf-8")
    return golden, time.perf_counter() - t
