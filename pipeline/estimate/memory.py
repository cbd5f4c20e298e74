"""Memory of an engine on its target: weights per layout, activations, the fit, and the host
memory a build needs.

* weights resident for both phases (:func:`~trtpipe.pipeline.estimate.weights.engine_weight_bytes`):
  ``split`` and ``dual_profile`` on GPUs, ``shared`` (one weights.data) on cpu;
* activations: the prefill peak of one layer for ``max_num_tokens`` tokens, plus the attention
  scores where a kernel materializes them (ONNX Runtime CPU, ``plugin_free`` TensorRT);
* the fit: weights + KV pool + activations against the target's usable memory, and how many
  full-length sequences would fit beside the weights and activations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trtpipe.pipeline.estimate.kv import KVEstimate
from trtpipe.pipeline.estimate.model_counts import linear_params, total_params
from trtpipe.pipeline.estimate.notices import EstimateWarning
from trtpipe.pipeline.estimate.units import fmt_bytes
from trtpipe.pipeline.estimate.weights import PhaseWeights, engine_weight_bytes
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.targets import TargetSpec
from trtpipe.plugins.core.dtypes import activation_dtype, dtype
from trtpipe.runtime.artifact.model_config import ModelConfig

SCORE_BYTES = 4  # attention scores / softmax are float32 (docs/contracts.md)
LOGIT_BYTES = 4
# Host memory of a build (the farm schedules against it; docs/estimate.md, "Host memory to build").
# CPU target: measured. Peak RSS of today's (non-streamed) `trtpipe build` on synthetic Q4_0
# Llamas (bench/build_memory.py, bench/build_stage_peaks.py, recipes/synthetic-llama-mid-cpu.yaml;
# 2-core AMD EPYC Zen 3, 2026-12-08): the 2- and 1-layer shapes differ by 50.6 M linear
# parameters and 0.56 GB of peak -> ~11 B per linear parameter; the rest of the 1-layer peak
# (4.55 - 0.56 - 0.26 GB of libraries) over its 131 M embedding / head parameters -> ~28 B per
# embedding / head parameter. The mid shape (2 layers): 5.04 GB by the formula, 5.14 GB measured.
BUILD_CPU_LINEAR_BYTES = 11  # per linear (GEMM) parameter: int4 copies, graph copies, fp32 golden
BUILD_CPU_TABLE_BYTES = 28  # per embedding / head / norm / bias parameter: fp32 tables in every graph
BUILD_CPU_BASE_BYTES = 260_000_000  # Python, torch, onnx, onnxruntime loaded (0.26 GB)
# TensorRT targets: NOT measured here (no TensorRT on this host). Kept from public reports: the
# builder peaks at 3-4x the parameter bytes (TensorRT Edge-LLM #30, TensorRT-LLM #2976): 4 x the
# fp32 parameter bytes plus the libraries. (SmolLM2-135M's CPU build peaked at 2.78 GB against
# this formula's 2.96 GB; the mid synthetic shape's at 5.14 GB against its 4.52 GB.)
BUILD_HOST_PEAK_FACTOR = 4
BUILD_PARAM_BYTES = 4  # fp32
BUILD_HOST_BASE_BYTES = 768 * 2**20


def build_host_bytes(config: ModelConfig, family: str) -> int:
    """Host memory ``trtpipe build`` needs at its peak, in bytes, for a target of ``family``
    (``cpu``, or a TensorRT target: ``orin``, ``a100``, ``h200``, a row name such as ``orin-32gb``).

    * ``cpu`` (measured, docs/estimate.md "Host memory to build"): ``BUILD_CPU_LINEAR_BYTES (11)
      x linear_params + BUILD_CPU_TABLE_BYTES (28) x (every other parameter: embedding, head unless
      tied, norms, biases) + BUILD_CPU_BASE_BYTES (0.26 GB)``; the coefficients were fitted on
      Q4_0 synthetic Llamas with an untied Q8_0 head (mid shape: 5.04 GB predicted, 5.14 GB
      measured, 0.98x).
    * TensorRT targets (unmeasured: no TensorRT build has run here):
      ``BUILD_HOST_PEAK_FACTOR (4) x 4 B (fp32) x total_params + BUILD_HOST_BASE_BYTES (768 MiB)``,
      the builder's 3-4x parameter bytes from public reports plus the libraries."""
    if family == "cpu":
        lin = linear_params(config)
        return (
            BUILD_CPU_LINEAR_BYTES * lin + BUILD_CPU_TABLE_BYTES * (total_params(config) - lin) + BUILD_CPU_BASE_BYTES
        )
    return BUILD_HOST_PEAK_FACTOR * BUILD_PARAM_BYTES * total_params(config) + BUILD_HOST_BASE_BYTES


def build_host_formula(family: str) -> str:
    """The formula and source of :func:`build_host_bytes` for ``family``, for the estimate's table."""
    if family == "cpu":
        return (
            f"{BUILD_CPU_LINEAR_BYTES} B x linear params + {BUILD_CPU_TABLE_BYTES} B x embedding/head params + "
            f"{BUILD_CPU_BASE_BYTES / 1e9:.2f} GB of libraries (measured per-parameter peak of the CPU build, "
            "docs/estimate.md)"
        )
    return (
        f"{BUILD_HOST_PEAK_FACTOR} x fp32 parameter bytes + {BUILD_HOST_BASE_BYTES // 2**20} MiB of libraries "
        "(export / TensorRT builder peak from public reports; unmeasured here)"
    )


@dataclass(frozen=True)
class Activations:
    """Activation memory of the two execution contexts (prefill, decode), in bytes."""

    prefill_bytes: int  # one layer's live tensors for max_num_tokens tokens + logits + scores
    scores_bytes: int  # the prefill's materialized attention scores (0 with online softmax)
    decode_bytes: int  # the same for a max_batch_size decode step

    @property
    def total_bytes(self) -> int:
        # One execution context per phase, each with its own scratch (both layouts).
        return self.prefill_bytes + self.decode_bytes

    def to_dict(self) -> dict[str, Any]:
        """The flat activation keys of ``trtpipe estimate --json``."""
        return {
            "prefill_activation_bytes": self.prefill_bytes,
            "attention_scores_bytes": self.scores_bytes,
            "decode_activation_bytes": self.decode_bytes,
            "activation_bytes": self.total_bytes,
        }


def activation_bytes(recipe: Recipe, config: ModelConfig, family: str) -> Activations:
    """Peak activations: per token ``hidden + 2 x FFN + (heads + 2 x kv_heads) x head_dim``
    values live inside a layer (residual, gate and up, q/k/v) at the activation dtype, logits
    of the last token of each sequence (float32), and the attention scores ``heads x tokens x
    max_seq_len`` (float32, one layer) where a kernel materializes them: ONNX Runtime's CPU
    attention and the plugin-free TensorRT lowering; the PagedAttention plugin uses an online
    softmax."""
    act = {ph: dtype(activation_dtype(getattr(recipe.precision, ph), family)).itemsize for ph in ("prefill", "decode")}
    qkv = (config.num_heads + 2 * max(config.layer_num_kv_heads)) * config.head_dim
    row = config.hidden_size + 2 * config.intermediate_size + qkv
    materialized = family == "cpu" or recipe.engine.plugin_free
    t, b, ctx = recipe.max_num_tokens, recipe.max_batch_size, recipe.max_seq_len
    scores = config.num_heads * t * ctx * SCORE_BYTES if materialized else 0
    prefill = t * row * act["prefill"] + min(b, t) * config.vocab_size * LOGIT_BYTES + scores
    decode = (
        b * row * act["decode"]
        + b * config.vocab_size * LOGIT_BYTES
        + (config.num_heads * b * ctx * SCORE_BYTES if materialized else 0)
    )
    return Activations(prefill, scores, decode)


@dataclass(frozen=True)
class WeightsEstimate:
    """Weights of both phases and what a layout keeps resident (bytes)."""

    layout: str  # split | dual_profile (GPU), shared (cpu)
    prefill: PhaseWeights
    decode: PhaseWeights
    split_bytes: int  # two plans (GPU) or the one shared weights.data (cpu)
    dual_profile_bytes: int | None  # one plan; None on cpu or with phases of different precision
    engine_bytes: int  # for `layout`

    def to_dict(self) -> dict[str, Any]:
        """The flat weight keys of ``trtpipe estimate --json`` (each phase with its totals)."""
        phases = {
            ph: {**asdict(w), "total_bytes": w.total_bytes, "step_read_bytes": w.step_read_bytes}
            for ph, w in (("prefill", self.prefill), ("decode", self.decode))
        }
        return {
            "layout": self.layout,
            **phases,
            "engine_weight_bytes_split": self.split_bytes,
            "engine_weight_bytes_dual_profile": self.dual_profile_bytes,
            "engine_weight_bytes": self.engine_bytes,
        }


def weights_estimate(prefill: PhaseWeights, decode: PhaseWeights, family: str, recipe_layout: str) -> WeightsEstimate:
    """Resident weights on ``family``: cpu artifacts always share one weights.data; GPU engines
    take the recipe's ``engine.layout``."""
    layout = "shared" if family == "cpu" else recipe_layout
    split = engine_weight_bytes(prefill, decode, "shared" if family == "cpu" else "split")
    dual = None if family == "cpu" else engine_weight_bytes(prefill, decode, "dual_profile")
    assert split is not None
    # dual_profile with phases of different precision is refused by the recipe itself
    engine = dual if layout == "dual_profile" and dual is not None else split
    return WeightsEstimate(layout, prefill, decode, split, dual, engine)


@dataclass(frozen=True)
class MemoryFit:
    """The engine against the target's memory (bytes)."""

    engine_bytes: int  # weights(layout) + KV pool + activations
    engine_bytes_split: int
    engine_bytes_dual_profile: int | None
    usable_memory_bytes: int
    fits: bool
    max_sequences: int  # full-length sequences that fit beside weights and activations
    room_bytes: int  # usable - weights - activations (the KV pool's room; may be negative)

    def to_dict(self) -> dict[str, Any]:
        """The flat fit keys of ``trtpipe estimate --json``."""
        return {
            "engine_bytes": self.engine_bytes,
            "engine_bytes_split": self.engine_bytes_split,
            "engine_bytes_dual_profile": self.engine_bytes_dual_profile,
            "usable_memory_bytes": self.usable_memory_bytes,
            "fits": self.fits,
            "max_sequences": self.max_sequences,
        }


def memory_fit(w: WeightsEstimate, kv: KVEstimate, act: Activations, target: TargetSpec) -> MemoryFit:
    """Weights + KV pool + activations against ``target.usable_memory_bytes``; the room left
    for KV holds ``(room // block_bytes - 1) // blocks_per_sequence`` sequences (null block)."""
    usable = target.usable_memory_bytes
    engine = w.engine_bytes + kv.pool_bytes + act.total_bytes
    room = usable - w.engine_bytes - act.total_bytes
    max_seqs = max(0, room // kv.block_bytes - 1) // kv.blocks_per_sequence if room > 0 else 0
    dual = None if w.dual_profile_bytes is None else w.dual_profile_bytes + kv.pool_bytes + act.total_bytes
    return MemoryFit(
        engine, w.split_bytes + kv.pool_bytes + act.total_bytes, dual, usable, engine <= usable, max_seqs, room
    )


def does_not_fit_warning(
    fit: MemoryFit, w: WeightsEstimate, kv: KVEstimate, act: Activations, target: TargetSpec, max_seq_len: int
) -> EstimateWarning | None:
    """The failing warning of an engine over the target's usable memory, with the fix; None if it fits."""
    if fit.fits:
        return None
    if fit.max_sequences == 0:
        fix = (
            f"the weights ({fmt_bytes(w.engine_bytes)}) and activations ({fmt_bytes(act.total_bytes)}) leave "
            "no room for one sequence: use int4 weights, lower max_num_tokens, or a target with more memory"
        )
    else:
        fix = (
            f"lower kv_cache.memory_budget_mib to <= {int(fit.room_bytes // 2**20)} (room for "
            f"{fit.max_sequences} sequences of {max_seq_len} tokens), or use int4 weights"
        )
    return EstimateWarning(
        "does_not_fit",
        f"does not fit on {target.name}: the engine needs {fmt_bytes(fit.engine_bytes)} (weights "
        f"{fmt_bytes(w.engine_bytes)} + KV pool {fmt_bytes(kv.pool_bytes)} + activations "
        f"{fmt_bytes(act.total_bytes)}) but {fmt_bytes(fit.usable_memory_bytes)} is usable "
        f"({fmt_bytes(target.memory_bytes)} - {fmt_bytes(target.reserved_bytes)} reserved). Fix: {fix}",
        True,
    )


def scores_note(act: Activations, family: str) -> str:
    if not act.scores_bytes:
        return "attention scores are not materialized (online softmax in the PagedAttention plugin)"
    who = "ONNX Runtime CPU attention" if family == "cpu" else "plugin-free TensorRT lowering"
    return f"attention scores are materialized (float32, heads x max_num_tokens x max_seq_len per layer) by the {who}"


def build_memory_notes(config: ModelConfig, target: TargetSpec) -> tuple[str, ...]:
    """A note when a build of the model needs more host memory than the target has."""
    need = build_host_bytes(config, target.family)
    if need <= target.memory_bytes:
        return ()
    what = (
        "the CPU build's measured peak per parameter"
        if target.family == "cpu"
        else "exporter / TensorRT builder peak, unmeasured"
    )
    return (
        f"building needs about {fmt_bytes(need)} of host memory ({what}), "
        f"more than {target.name}'s {fmt_bytes(target.memory_bytes)}: export on a bigger machine "
        "(the build spec) and finish the plans on the target",
    )
