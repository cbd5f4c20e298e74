"""``trtpipe estimate``: memory and latency of a recipe on a target, from model facts alone.

No weights are read and nothing is built: the numbers come from the architecture (layers, heads,
sizes), the recipe (precision per phase, KV pool, limits, scenarios) and the target table
(:mod:`trtpipe.pipeline.targets`). ``docs/estimate.md`` has every formula and its source.

One concept per module (bytes are exact counts; times are rooflines):

    model_counts  parameters, FLOP per step, KV bytes per sequence
    weights       weight bytes per phase (INT4 group formats) and per layout
    kv            the KV cache: bytes per token / sequence, the paged pool
    memory        activations, the fit against the target's memory, host memory of a build
    latency       roofline TTFT/TPOT per scenario and percentile, budget warnings
    result        the Estimate record (small records composed; the flat JSON document)
    estimator     estimate(): the stages composed (pure)
    model_facts   model facts of a recipe without weights (GGUF metadata, config.json)
    render        the rich printout
    command       run_estimate(): ``trtpipe estimate`` end to end, exit code

Exit code of :func:`run_estimate`: 0 fits and every budget is above its floor; 1 the engine does
not fit in the target's memory or a budget is below its physical floor. Recipe errors raise
:class:`~trtpipe.pipeline.recipe.RecipeError` (the CLI turns them into exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from trtpipe.pipeline.estimate.command import run_estimate
from trtpipe.pipeline.estimate.estimator import estimate, roofline, windowed_config
from trtpipe.pipeline.estimate.kv import KVEstimate
from trtpipe.pipeline.estimate.latency import LatencyRow, Roofline, roofline_s
from trtpipe.pipeline.estimate.memory import (
    BUILD_CPU_BASE_BYTES,
    BUILD_CPU_LINEAR_BYTES,
    BUILD_CPU_TABLE_BYTES,
    BUILD_HOST_BASE_BYTES,
    BUILD_HOST_PEAK_FACTOR,
    Activations,
    MemoryFit,
    WeightsEstimate,
    activation_bytes,
    build_host_bytes,
    build_host_formula,
)
from trtpipe.pipeline.estimate.model_counts import (
    decode_flops,
    kv_bytes_per_layer,
    kv_bytes_per_sequence,
    linear_params,
    prefill_flops,
    total_params,
)
from trtpipe.pipeline.estimate.model_facts import model_config_for
from trtpipe.pipeline.estimate.notices import EstimateWarning
from trtpipe.pipeline.estimate.render import render
from trtpipe.pipeline.estimate.result import EXIT_FAILED, EXIT_OK, Estimate
from trtpipe.pipeline.estimate.weights import PhaseWeights, engine_weight_bytes, phase_weights
from trtpipe.plugins.core.dtypes import activation_dtype

__all__: Sequence[str] = (
    "Estimate",
    "EstimateWarning",
    "LatencyRow",
    "PhaseWeights",
    "estimate",
    "run_estimate",
    "model_config_for",
    "phase_weights",
    "engine_weight_bytes",
    "kv_bytes_per_layer",
    "kv_bytes_per_sequence",
    "prefill_flops",
    "decode_flops",
    "roofline_s",
    "linear_params",
    "total_params",
    "activation_dtype",
    "activation_bytes",
    "Activations",
    "Roofline",
    "KVEstimate",
    "MemoryFit",
    "WeightsEstimate",
    "build_host_bytes",
    "build_host_formula",
    "render",
    "roofline",
    "windowed_config",
    "BUILD_CPU_BASE_BYTES",
    "BUILD_CPU_LINEAR_BYTES",
    "BUILD_CPU_TABLE_BYTES",
    "BUILD_HOST_BASE_BYTES",
    "BUILD_HOST_PEAK_FACTOR",
    "EXIT_OK",
    "EXIT_FAILED",
)
