"""``estimate()``: a recipe and its model facts on a target -> an :class:`Estimate`. Pure: no I/O.

The stages: the recipe's sliding-window override -> weights per phase -> KV cache -> activations
-> the fit against the target's memory -> roofline latencies of each scenario.
"""

from __future__ import annotations

from trtpipe.pipeline.estimate.kv import kv_estimate
from trtpipe.pipeline.estimate.latency import Roofline, latencies
from trtpipe.pipeline.estimate.memory import (
    activation_bytes,
    build_host_bytes,
    build_memory_notes,
    does_not_fit_warning,
    memory_fit,
    scores_note,
    weights_estimate,
)
from trtpipe.pipeline.estimate.result import Estimate
from trtpipe.pipeline.estimate.weights import phase_weights
from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.targets import TargetSpec, compute_dtype
from trtpipe.plugins.core.dtypes import kv_cache_dtype
from trtpipe.runtime.artifact.model_config import ModelConfig


def windowed_config(recipe: Recipe, config: ModelConfig) -> ModelConfig:
    """``config`` with the recipe's ``sliding_window`` override applied to every layer (as the build does)."""
    return with_sliding_window(config, recipe.sliding_window)


def roofline(recipe: Recipe, config: ModelConfig, target: TargetSpec) -> Roofline:
    """The step-time model of ``recipe`` on ``target``: its phases' weights, compute dtypes and KV
    dtype (``config`` with the recipe's window override already applied, :func:`windowed_config`).
    Also what bench/peers.py takes its physical floors from."""
    fam = target.family
    int4 = recipe.precision.int4
    pre, dec = (
        phase_weights(
            config,
            getattr(recipe.precision, ph),
            fam,
            group_size=int4.group_size,
            symmetric=int4.symmetric,
            cpu_float_zero_points=recipe.engine.ort_float_zero_points,
        )
        for ph in ("prefill", "decode")
    )
    kv_dtype = kv_cache_dtype(recipe.kv_cache.dtype, recipe.precision.decode, fam)
    return Roofline(
        config,
        target,
        pre,
        dec,
        compute_dtype(recipe.precision.prefill, fam),
        compute_dtype(recipe.precision.decode, fam),
        kv_dtype,
        recipe.max_num_tokens,
    )


def estimate(recipe: Recipe, config: ModelConfig, target: TargetSpec, report: dict | None = None) -> Estimate:
    """Estimate ``recipe`` (with the model facts ``config``) on ``target``.

    ``report``: a validate report.json document (:func:`trtpipe.runtime.measure.report.document.load_report`)
    whose measured percentiles are attached to the latency rows. Pure: no I/O.
    """
    fam = target.family
    config = windowed_config(recipe, config)
    roof = roofline(recipe, config, target)
    weights = weights_estimate(roof.prefill, roof.decode, fam, recipe.engine.layout)
    kv = kv_estimate(recipe, config, fam)
    act = activation_bytes(recipe, config, fam)
    fit = memory_fit(weights, kv, act, target)
    misfit = does_not_fit_warning(fit, weights, kv, act, target, recipe.max_seq_len)
    rows, lat_warnings, lat_notes = latencies(recipe, roof, report)
    return Estimate(
        recipe_name=recipe.name,
        model_name=config.name or "(unnamed model)",
        target=target,
        weights=weights,
        kv=kv,
        activations=act,
        memory=fit,
        latencies=tuple(rows),
        warnings=tuple(([misfit] if misfit else []) + lat_warnings),
        notes=(scores_note(act, fam), *lat_notes, *build_memory_notes(config, target)),
        build_host_bytes=build_host_bytes(config, fam),
    )
