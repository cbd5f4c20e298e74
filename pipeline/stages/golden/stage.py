"""Golden stage: the golden outputs of a build (cached by content, :mod:`.cache`), written as
``golden.json`` into the folder being built; ``trtpipe validate`` compares the engines with them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.golden.cache import cached_golden, golden_key
from trtpipe.pipeline.stages.golden.prompts import GOLDEN_PROMPTS, GOLDEN_SETS, GoldenPrompt
from trtpipe.pipeline.stages.golden.record import record_golden
from trtpipe.pipeline.stages.load import PreparedModel

if TYPE_CHECKING:  # export imports torch: a build needs it, validate and info do not
    from trtpipe.pipeline.stages.export import ExportedGraphs


def golden_for_build(
    loaded,
    sliding_window: int | None,
    num_tokens: int,
    make_ref: Callable[[], Any],
    artifact_root: Path,
    *,
    prompts: Sequence[GoldenPrompt] = GOLDEN_PROMPTS,
    log: Callable[[str], None] = print,
) -> tuple[dict, bool]:
    """The golden outputs of ``prompts`` a build writes: cached under ``artifact_root`` or recorded
    with the fp32 reference ``make_ref()`` (built only when recording). Returns (golden, reused)."""
    key = golden_key(loaded, sliding_window, prompts=prompts)

    def record(n: int) -> dict:
        log(
            f"recording golden outputs from the torch reference ({len(key.prompts)} prompts x up to {n} tokens; "
            f"cached for later builds of this model) ..."
        )
        return record_golden(
            make_ref(), loaded.tokenizer_json, loaded.config.chat_template, n, prompts=key.prompts, log=log
        )

    return cached_golden(artifact_root, key, num_tokens, record, log=log)


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
    """Write ``out_dir/golden.json`` (``validate.correctness.num_tokens`` tokens per prompt of the
    ``validate.correctness.golden_set``) from the
    cache under ``artifact_root`` or a new recording with the fp32 reference (reused from the
    export when it made one). Returns (golden, seconds)."""
    from trtpipe.pipeline.stages.export import reference_for

    t = time.perf_counter()
    golden, _ = golden_for_build(
        model.loaded,
        recipe.sliding_window,
        recipe.validation.correctness.num_tokens,
        lambda: exported.references.get("fp32") or reference_for(recipe, model, "fp32"),
        Path(artifact_root),
        prompts=GOLDEN_SETS[recipe.validation.correctness.golden_set],
        log=log,
    )
    (out_dir / GOLDEN_FILE).write_text(json.dumps(golden), encoding="utf-8")
    return golden, time.perf_counter() - t


__all__ = ["GOLDEN_FILE", "golden_for_build", "write_golden"]
