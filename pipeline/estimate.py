"""``trtpipe estimate``: memory and latency of a recipe on a target, from model facts alone.

No weights are read and nothing is built: the numbers come from the architecture (layers, heads,
sizes), the recipe (precision per phase, KV pool, limits, scenarios) and the target table
(:mod:`trtpipe.pipeline.targets`). ``docs/estimate.md`` has every formula and its source.

What is modelled (bytes are exact counts; times are rooflines):

* weights per phase: linear layers at the phase precision (INT4: 0.5 B per weight plus the
  per-group scale/zero point of the target's format; on cpu, GGUF Q4_1 blocks in the form
  ``engine.ort_float_zero_points`` picks, and the 8-bit LM head of a tied Q8_0 embedding),
  embedding / lm_head / norms at the phase's activation dtype;
* KV: ``2 x kv_heads_l x head_dim x dtype`` bytes per token and layer, a sliding-window layer
  holding at most ``window`` tokens; the recipe's pool (``plan_kv_num_blocks``);
* activations: the prefill peak of one layer for ``max_num_tokens`` tokens, plus the attention
  scores where a kernel materializes them (ONNX Runtime CPU, ``plugin_free`` TensorRT);
* time: ``max(FLOP / FLOP/s, bytes / (bytes/s))`` per step, at achievable rates for the
  prediction and at peak rates for the physical floor (a budget below it cannot be met).

Exit code of :func:`run_estimate`: 0 fits and every budget is above its floor; 1 the engine does
not fit in the target's memory or a budget is below its physical floor. Recipe errors raise
:class:`~trtpipe.pipeline.recipe.RecipeError` (the CLI turns them into exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from trtpipe.pipeline.recipe import (DTYPE_BYTES, Recipe, Scenario, check_recipe_against_model,
                                     load_recipe, plan_kv_num_blocks, resolve_recipe_path)
from trtpipe.pipeline.targets import HostMeasurement, TargetSpec, compute_dtype, get_target
from trtpipe.runtime.model_config import ModelConfig

EXIT_OK, EXIT_FAILED = 0, 1

INT4_BITS_BYTES = 0.5  # two 4-bit codes per byte
# Per-group overhead of INT4 weights (one group = group_size weights along K of one row): cpu
# artifacts of GGUF Q4_1 weights (float zero points) take one of the two forms of
# ort_lowering (engine.ort_float_zero_points); GPU plugins keep an fp16 scale and, when
# asymmetric, a packed 4-bit zero point.
INT4_GROUP_BYTES_CPU = {  # per group of a cpu artifact, by engine.ort_float_zero_points
    "exact": 8.5,  # 4-bit codes; fp32 scale, packed 4-bit zero point, fp32 min (correction term)
    "int8": 5.0,   # 8-bit codes (Q4_1 re-coded, 1 B per weight); fp32 scale, uint8 zero point
}
CPU_CODE_BYTES = {"exact": INT4_BITS_BYTES, "int8": 1.0}
# A tied GGUF embedding (Q8_0) also becomes an 8-bit MatMulNBits LM head in int4 phases (the
# fp32 table stays for the embedding Gather): 1 B per weight + fp32 scale + uint8 zero point
# per block of 32.
CPU_INT8_HEAD_BYTES_PER_WEIGHT = 1.0 + 5.0 / 32
INT4_GROUP_BYTES_GPU_SCALE = 2.0
INT4_GROUP_BYTES_GPU_ZERO_POINT = 0.5
SCORE_BYTES = 4  # attention scores / softmax are float32 (docs/contracts.md)
# Host memory of a build (the farm schedules against it): the exporter holds the fp32 torch
# reference (4 B per parameter) and the graphs it serializes; TensorRT's builder peaks at 3-4x
# the parameter bytes in public reports (Jetson builds are killed for it). 4x the fp32 bytes
# plus the loaded libraries (Python, torch, onnx, onnxruntime). Measured here: `trtpipe build
# smollm2-135m-cpu` peaks at 2.78 GB RSS (/usr/bin/time -v); this gives 2.96 GB.
BUILD_HOST_PEAK_FACTOR = 4
BUILD_PARAM_BYTES = 4  # fp32
BUILD_HOST_BASE_BYTES = 768 * 2**20
LOGIT_BYTES = 4


# --------------------------------------------------------------------------------------------
# Model facts -> counts
# --------------------------------------------------------------------------------------------

def linear_params(config: ModelConfig) -> int:
    """Weights of every GEMM except lm_head, over all layers (layers may differ in kv heads)."""
    h, d = config.hidden_size, config.head_dim
    per_layer_fixed = 2 * h * config.num_heads * d + 3 * h * config.intermediate_size
    return sum(per_layer_fixed + 2 * h * kvh * d for kvh in config.layer_num_kv_heads)


def bias_params(config: ModelConfig) -> int:
    """q/k/v biases (Qwen2) over all layers; 0 without ``attention_bias``."""
    if not config.attention_bias:
        return 0
    d = config.head_dim
    return sum((config.num_heads + 2 * kvh) * d for kvh in config.layer_num_kv_heads)


def norm_params(config: ModelConfig) -> int:
    """RMSNorm weights: two per layer and the final one."""
    return (2 * config.num_layers + 1) * config.hidden_size


def total_params(config: ModelConfig) -> int:
    """Every parameter: embedding, lm_head unless tied, GEMMs, biases, norms."""
    emb = config.vocab_size * config.hidden_size
    lm_head = 0 if config.tie_word_embeddings else emb
    return emb + lm_head + linear_params(config) + bias_params(config) + norm_params(config)


def build_host_bytes(config: ModelConfig) -> int:
    """Host memory ``trtpipe build`` needs at its peak, in bytes:
    ``BUILD_HOST_PEAK_FACTOR x 4 B (fp32) x total_params + BUILD_HOST_BASE_BYTES`` (export and
    TensorRT builder peaks, plus the libraries)."""
    return BUILD_HOST_PEAK_FACTOR * BUILD_PARAM_BYTES * total_params(config) + BUILD_HOST_BASE_BYTES


def kv_bytes_per_layer(config: ModelConfig, num_tokens: int, dtype_bytes: int) -> tuple[int, ...]:
    """K and V bytes of each layer for a sequence of ``num_tokens`` tokens:
    ``2 x kv_heads_l x head_dim x dtype_bytes x min(num_tokens, window_l)`` (window 0 = none)."""
    out = []
    for kvh, w in zip(config.layer_num_kv_heads, config.layer_sliding_window):
        tokens = min(num_tokens, w) if w > 0 else num_tokens
        out.append(2 * kvh * config.head_dim * dtype_bytes * tokens)
    return tuple(out)


def kv_bytes_per_sequence(config: ModelConfig, num_tokens: int, dtype_bytes: int) -> int:
    """KV bytes of one sequence of ``num_tokens`` tokens, all layers (windows applied)."""
    return sum(kv_bytes_per_layer(config, num_tokens, dtype_bytes))


def _attended_keys(num_tokens: int, window: int) -> int:
    """Sum over a causal prefill of n tokens of the keys each query sees: sum_i min(i, W)."""
    n = num_tokens
    if window <= 0 or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def prefill_flops(config: ModelConfig, num_tokens: int) -> int:
    """FLOP of prefilling one sequence of ``num_tokens`` tokens from position 0:
    ``2 x linear_params x n`` (GEMMs) + ``4 x heads x head_dim x sum_i min(i, W)`` per layer
    (QK^T and PV, causal) + ``2 x hidden x vocab`` (logits of the last token only)."""
    gemm = 2 * linear_params(config) * num_tokens
    attn = sum(4 * config.num_heads * config.head_dim * _attended_keys(num_tokens, w)
               for w in config.layer_sliding_window)
    return gemm + attn + 2 * config.hidden_size * config.vocab_size


def decode_flops(config: ModelConfig, context_tokens: int) -> int:
    """FLOP of one decode token at ``context_tokens`` tokens of context (itself included)."""
    attn = sum(4 * config.num_heads * config.head_dim * (min(context_tokens, w) if w > 0
                                                           else context_tokens)
               for w in config.layer_sliding_window)
    return 2 * linear_params(config) + attn + 2 * config.hidden_size * config.vocab_size


def roofline_s(flops: float, num_bytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """Time of a step bound by compute or memory, whichever is slower (the roofline)."""
    return max(flops / flops_per_s, num_bytes / bytes_per_s)


# --------------------------------------------------------------------------------------------
# Weights per phase
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseWeights:
    """Weight bytes of one phase's graph/plan."""

    precision: str  # fp32 | fp16 | bf16 | int4
    activation_dtype: str  # dtype of embedding, lm_head, norms and activations
    linear_bytes: int  # GEMM weights (INT4: packed codes)
    int4_group_bytes: int  # INT4 scales + zero points (0 unless int4)
    embedding_bytes: int
    lm_head_bytes: int  # 0 when tied to the embedding (one tensor); cpu int4: the 8-bit head
    other_bytes: int  # norms and biases

    @property
    def total_bytes(self) -> int:
        return (self.linear_bytes + self.int4_group_bytes + self.embedding_bytes
                + self.lm_head_bytes + self.other_bytes)

    @property
    def step_read_bytes(self) -> int:
        """Bytes one forward step reads: everything but the embedding table, of which it only
        gathers a few rows, unless the table is also the (tied) lm_head."""
        head = self.lm_head_bytes or self.embedding_bytes
        return self.linear_bytes + self.int4_group_bytes + head + self.other_bytes


def activation_dtype(precision: str, family: str) -> str:
    """A phase's activation dtype on a target family: int4 is weight-only (fp32 activations on
    cpu, fp16 on GPUs), the rest run in their own dtype (as :meth:`Recipe.activation_dtype`)."""
    if precision == "int4":
        return "fp32" if family == "cpu" else "fp16"
    return precision


def phase_weights(config: ModelConfig, precision: str, family: str, *, group_size: int = 32,
                  symmetric: bool = False, cpu_float_zero_points: str = "exact") -> PhaseWeights:
    """Weight bytes of a phase at ``precision`` on a target family (``cpu`` or a GPU).

    cpu INT4 assumes the shipped source, a GGUF with Q4_1 GEMM weights and a tied Q8_0
    embedding: ``cpu_float_zero_points`` (``exact`` | ``int8``, the recipe's resolved
    ``engine.ort_float_zero_points``) picks the block form (:data:`INT4_GROUP_BYTES_CPU`), and
    the tied embedding adds an 8-bit LM head. Raises ValueError for an unknown form.
    """
    act = activation_dtype(precision, family)
    act_b = DTYPE_BYTES[act]
    n_lin = linear_params(config)
    emb = config.vocab_size * config.hidden_size * act_b
    lm_head = 0 if config.tie_word_embeddings else emb
    if precision == "int4":
        groups = n_lin // group_size
        if family == "cpu":
            if cpu_float_zero_points not in INT4_GROUP_BYTES_CPU:
                raise ValueError(f"cpu_float_zero_points {cpu_float_zero_points!r}: expected exact or int8")
            linear = int(n_lin * CPU_CODE_BYTES[cpu_float_zero_points])
            group_bytes = int(groups * INT4_GROUP_BYTES_CPU[cpu_float_zero_points])
            if config.tie_word_embeddings:
                lm_head = int(config.vocab_size * config.hidden_size * CPU_INT8_HEAD_BYTES_PER_WEIGHT)
        else:
            linear = int(n_lin * INT4_BITS_BYTES)
            group_bytes = int(groups * (INT4_GROUP_BYTES_GPU_SCALE
                                        + (0 if symmetric else INT4_GROUP_BYTES_GPU_ZERO_POINT)))
    else:
        linear, group_bytes = n_lin * DTYPE_BYTES[precision], 0
    return PhaseWeights(precision, act, linear, group_bytes, emb, lm_head,
                        (norm_params(config) + bias_params(config)) * act_b)


def engine_weight_bytes(prefill: PhaseWeights, decode: PhaseWeights, layout: str) -> int | None:
    """Weights resident for both phases.

    ``split`` (two TensorRT plans): each plan holds its own copy. ``dual_profile``: one copy;
    None when the phases differ in precision (that layout needs one). ``shared`` (cpu: one
    weights.data, identical initializers stored once): the decode GEMMs are added to the prefill
    weights; embedding, lm_head and norms are shared when both phases have the same dtype.
    """
    same = prefill.precision == decode.precision
    if layout == "split":
        return prefill.total_bytes + decode.total_bytes
    if layout == "dual_profile":
        return prefill.total_bytes if same else None
    if layout == "shared":
        if same:
            return prefill.total_bytes
        extra = decode.linear_bytes + decode.int4_group_bytes
        if decode.activation_dtype != prefill.activation_dtype:
            extra += decode.embedding_bytes + decode.lm_head_bytes + decode.other_bytes
        elif decode.lm_head_bytes != prefill.lm_head_bytes:  # e.g. the cpu int4 8-bit head
            extra += decode.lm_head_bytes
        return prefill.total_bytes + extra
    raise ValueError(f"layout {layout!r}")


# --------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LatencyRow:
    """One predicted latency of a scenario at a percentile (times in ms).

    ``prompt_tokens`` is that percentile of the scenario's prompt-length distribution;
    ``context_tokens`` the context of the decode step (TPOT rows; the floor uses
    ``prompt_tokens + 1``); ``batch`` the decode batch the prediction assumes.
    """

    scenario: str
    metric: str  # ttft_ms | tpot_ms
    percentile: str  # p50 | p90 | p95 | p99
    prompt_tokens: int
    context_tokens: int
    batch: int
    floor_ms: float  # peak rates, batch 1: no engine is faster
    predicted_ms: float  # achievable rates, the scenario's batch
    bound: str  # compute | memory (of the prediction)
    budget_ms: float | None
    measured_ms: float | None = None  # from the last validate report, when there is one

    @property
    def ratio(self) -> float | None:
        """predicted / measured (the model's error), or None without a measurement."""
        if self.measured_ms is None or self.measured_ms <= 0:
            return None
        return self.predicted_ms / self.measured_ms


@dataclass(frozen=True)
class EstimateWarning:
    """Something the user should know. ``fails``: it makes the exit code 1."""

    kind: str  # does_not_fit | budget_below_floor | budget_below_prediction | note
    message: str
    fails: bool


@dataclass(frozen=True)
class Estimate:
    """Memory and latency of a recipe on a target (bytes exact, times in ms)."""

    recipe_name: str
    model_name: str
    target: TargetSpec
    layout: str  # split | dual_profile (GPU), shared (cpu)
    prefill: PhaseWeights
    decode: PhaseWeights
    engine_weight_bytes_split: int
    engine_weight_bytes_dual_profile: int | None
    engine_weight_bytes: int  # for `layout`
    kv_dtype: str
    kv_bytes_per_token: int  # all layers
    kv_bytes_per_token_layers: tuple[int, ...]
    kv_bytes_per_sequence: int  # max_seq_len tokens, windows applied
    kv_block_bytes: int
    kv_blocks_per_sequence: int  # a max_seq_len sequence in the pool (window releases applied)
    kv_pool_num_blocks: int  # null block included
    kv_pool_bytes: int
    kv_pool_max_sequences: int  # full-length sequences the recipe's pool holds
    prefill_activation_bytes: int  # one layer's live tensors for max_num_tokens tokens + logits
    attention_scores_bytes: int  # materialized scores (0 with an online-softmax kernel)
    decode_activation_bytes: int
    activation_bytes: int  # prefill + decode scratch (one execution context per phase)
    engine_bytes: int  # weights(layout) + KV pool + activations
    engine_bytes_split: int
    engine_bytes_dual_profile: int | None
    usable_memory_bytes: int
    fits: bool
    max_sequences: int  # full-length sequences that fit beside weights and activations
    latencies: tuple[LatencyRow, ...]
    warnings: tuple[EstimateWarning, ...]
    notes: tuple[str, ...]
    build_host_bytes: int = 0  # host memory a build of the recipe needs (build_host_bytes)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if any(w.fails for w in self.warnings) else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("target", "latencies")}
        d["target"] = self.target.to_dict()
        for phase in ("prefill", "decode"):
            d[phase]["total_bytes"] = getattr(self, phase).total_bytes
            d[phase]["step_read_bytes"] = getattr(self, phase).step_read_bytes
        d["latencies"] = [{**asdict(r), "ratio": r.ratio} for r in self.latencies]
        d["exit_code"] = self.exit_code
        return d


def _pct_fraction(pct: str) -> float:
    return int(pct[1:]) / 100.0


def _quantile_tokens(fixed: int | None, lo: int | None, hi: int | None, q: float) -> int:
    """The q-quantile of a length: fixed, or discrete uniform on [lo, hi] (smallest k with
    P(X <= k) >= q)."""
    if fixed is not None:
        return fixed
    assert lo is not None and hi is not None
    n = hi - lo + 1
    return lo + max(1, math.ceil(q * n - 1e-9)) - 1


def _lengths(s: Scenario, q: float) -> tuple[int, int] | None:
    """(prompt, output) tokens at quantile q; None for a prompt file (lengths unknown)."""
    p, o = s.prompt_tokens, s.output_tokens
    if p.file is not None:
        return None
    pu, ou = p.uniform, o.uniform
    prompt = _quantile_tokens(p.fixed, pu.min if pu else None, pu.max if pu else None, q)
    out = _quantile_tokens(o.fixed, ou.min if ou else None, ou.max if ou else None, q)
    return prompt, out


def _blocks_per_sequence(config: ModelConfig, max_seq_len: int, block_size: int) -> int:
    """Blocks a full-length sequence holds in steady decode. With one window W for every
    layer the KV manager releases blocks that left the window: ceil(W / block_size) + 1."""
    full = -(-max_seq_len // block_size)
    windows = set(config.layer_sliding_window)
    if len(windows) == 1 and (w := next(iter(windows))) > 0:
        return min(full, -(-w // block_size) + 1)
    return full


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    if n < 1e3:
        return f"{n:.0f} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1e3 or unit == "GB":
            return f"{n / scale:.{1 if unit != 'GB' else 2}f} {unit}"
    return f"{n:.0f} B"


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


def activation_bytes(recipe: Recipe, config: ModelConfig, family: str) -> Activations:
    """Peak activations: per token ``hidden + 2 x FFN + (heads + 2 x kv_heads) x head_dim``
    values live inside a layer (residual, gate and up, q/k/v) at the activation dtype, logits
    of the last token of each sequence (float32), and the attention scores ``heads x tokens x
    max_seq_len`` (float32, one layer) where a kernel materializes them: ONNX Runtime's CPU
    attention and the plugin-free TensorRT lowering; the PagedAttention plugin uses an online
    softmax."""
    act = {ph: DTYPE_BYTES[activation_dtype(getattr(recipe.precision, ph), family)]
           for ph in ("prefill", "decode")}
    qkv = (config.num_heads + 2 * max(config.layer_num_kv_heads)) * config.head_dim
    row = config.hidden_size + 2 * config.intermediate_size + qkv
    materialized = family == "cpu" or recipe.engine.plugin_free
    t, b, ctx = recipe.max_num_tokens, recipe.max_batch_size, recipe.max_seq_len
    scores = config.num_heads * t * ctx * SCORE_BYTES if materialized else 0
    prefill = t * row * act["prefill"] + min(b, t) * config.vocab_size * LOGIT_BYTES + scores
    decode = (b * row * act["decode"] + b * config.vocab_size * LOGIT_BYTES
              + (config.num_heads * b * ctx * SCORE_BYTES if materialized else 0))
    return Activations(prefill, scores, decode)


@dataclass(frozen=True)
class Roofline:
    """Step times of one recipe on one target: ``max(FLOP / FLOP/s, bytes / bytes/s)``.

    ``peak=True`` uses the target's peak rates (the physical floor), ``False`` the achievable
    ones (the prediction). Each method returns ``(seconds, "compute" | "memory")``.
    """

    config: ModelConfig
    target: TargetSpec
    prefill: PhaseWeights
    decode: PhaseWeights
    prefill_compute_dtype: str
    decode_compute_dtype: str
    kv_dtype_bytes: int
    max_num_tokens: int

    def _time(self, flops: float, nbytes: float, dtype: str, peak: bool) -> tuple[float, str]:
        tg = self.target
        fl = tg.flops_per_s(dtype) if peak else tg.achievable_flops_per_s(dtype)
        bw = tg.bandwidth_bytes_per_s if peak else tg.achievable_bandwidth_bytes_per_s
        return roofline_s(flops, nbytes, fl, bw), ("compute" if flops / fl >= nbytes / bw
                                                   else "memory")

    def ttft_s(self, prompt_tokens: int, peak: bool = False) -> tuple[float, str]:
        """Prefill of one prompt from position 0: its FLOP; the weights read once per chunk of
        ``max_num_tokens`` plus the KV written."""
        chunks = -(-prompt_tokens // self.max_num_tokens)
        nbytes = (chunks * self.prefill.step_read_bytes
                  + kv_bytes_per_sequence(self.config, prompt_tokens, self.kv_dtype_bytes))
        return self._time(prefill_flops(self.config, prompt_tokens), nbytes,
                          self.prefill_compute_dtype, peak)

    def tpot_s(self, context_tokens: int, batch: int = 1, peak: bool = False
               ) -> tuple[float, str]:
        """One decode step of ``batch`` sequences at ``context_tokens``: the decode weights
        read once, each sequence's KV read once."""
        kv = kv_bytes_per_sequence(self.config, context_tokens, self.kv_dtype_bytes)
        return self._time(batch * decode_flops(self.config, context_tokens),
                          self.decode.step_read_bytes + batch * kv, self.decode_compute_dtype,
                          peak)


def _decode_batch(s: Scenario, recipe: Recipe, roof: Roofline) -> int:
    """Sequences decoding together: the clients of a closed loop; for Poisson arrivals,
    Little's law (rate x the unloaded request time at p50 lengths); capped by max_batch_size."""
    if s.concurrency is not None:
        return min(s.concurrency, recipe.max_batch_size)
    lengths = _lengths(s, 0.5)
    assert lengths is not None and s.arrival_rate_per_s is not None
    prompt, out = lengths
    e2e = roof.ttft_s(prompt)[0] + out * roof.tpot_s(prompt + out // 2)[0]
    return max(1, min(recipe.max_batch_size, round(s.arrival_rate_per_s * e2e)))


def _latencies(recipe: Recipe, roof: Roofline, report: dict | None
               ) -> tuple[list[LatencyRow], list[EstimateWarning], list[str]]:
    """One row per scenario, metric (TTFT, TPOT) and percentile (p50 and every budgeted one);
    a warning per budget below its floor (fails) or below the prediction (does not fail)."""
    measured = {s.get("name"): s.get("summary") or {}
                for s in (report or {}).get("scenarios", [])}
    name = roof.target.name
    rows: list[LatencyRow] = []
    warnings: list[EstimateWarning] = []
    notes: list[str] = []
    for i, s in enumerate(recipe.validation.scenarios):
        if _lengths(s, 0.5) is None:
            notes.append(f"scenario {s.name}: prompts come from a file; lengths unknown before "
                         "tokenization, no latency estimate")
            continue
        budgets = {(m, p): v for m, p, v in s.budgets.limits()}
        batch = _decode_batch(s, recipe, roof)
        for metric in ("ttft_ms", "tpot_ms"):
            for pct in ["p50"] + [p for (m, p) in budgets if m == metric and p != "p50"]:
                lengths = _lengths(s, _pct_fraction(pct))
                assert lengths is not None
                prompt, out = lengths
                if metric == "ttft_ms":
                    ctx, b, what = prompt, 1, f"prefill of {prompt} tokens"
                    floor, _ = roof.ttft_s(prompt, peak=True)
                    pred, bound = roof.ttft_s(prompt)
                else:
                    ctx, b, what = (min(prompt + max(1, out // 2), recipe.max_seq_len), batch,
                                    f"decode at {prompt + 1} tokens")
                    floor, _ = roof.tpot_s(prompt + 1, 1, peak=True)
                    pred, bound = roof.tpot_s(ctx, b)
                got = measured.get(s.name, {}).get(metric)
                meas = got.get(pct) if isinstance(got, dict) else None
                budget = budgets.get((metric, pct))
                rows.append(LatencyRow(s.name, metric, pct, prompt, ctx, b, floor * 1e3,
                                       pred * 1e3, bound, budget,
                                       None if meas is None else float(meas)))
                if budget is None:
                    continue
                where = f"validate.scenarios[{i}] ({s.name}) budgets.{metric}.{pct} = {budget:g} ms"
                if budget < floor * 1e3:
                    warnings.append(EstimateWarning(
                        "budget_below_floor",
                        f"{where} is below the physical floor {_fmt_ms(floor * 1e3)} ms on "
                        f"{name} ({what}, batch 1, at peak FLOP/s and bandwidth): no engine "
                        f"can meet it. Fix: raise it to >= {math.ceil(floor * 1e3)} ms, use "
                        "lower-precision weights, or a faster target", True))
                elif budget < pred * 1e3:
                    tg = roof.target
                    warnings.append(EstimateWarning(
                        "budget_below_prediction",
                        f"{where} is below the predicted {_fmt_ms(pred * 1e3)} ms on {name} "
                        f"({bound}-bound at {tg.flops_fraction:g} of peak FLOP/s and "
                        f"{tg.bandwidth_fraction:g} of peak bandwidth, batch {b}): it may fail "
                        "validate", False))
    return rows, warnings, notes


def estimate(recipe: Recipe, config: ModelConfig, target: TargetSpec,
             report: dict | None = None) -> Estimate:
    """Estimate ``recipe`` (with the model facts ``config``) on ``target``.

    ``report``: a validate report.json document (:func:`trtpipe.runtime.report.load_report`)
    whose measured percentiles are attached to the latency rows. Pure: no I/O.
    """
    fam = target.family
    if recipe.sliding_window is not None:  # the recipe overrides the model's windows (as build)
        config = dataclasses.replace(
            config, layer_sliding_window=(recipe.sliding_window,) * config.num_layers)
    int4 = recipe.precision.int4
    pre, dec = (phase_weights(config, getattr(recipe.precision, ph), fam,
                              group_size=int4.group_size, symmetric=int4.symmetric,
                              cpu_float_zero_points=recipe.engine.ort_float_zero_points)
                for ph in ("prefill", "decode"))

    # -- memory ------------------------------------------------------------------------------
    layout = "shared" if fam == "cpu" else recipe.engine.layout
    w_split = engine_weight_bytes(pre, dec, "shared" if fam == "cpu" else "split")
    w_dual = None if fam == "cpu" else engine_weight_bytes(pre, dec, "dual_profile")
    assert w_split is not None
    # dual_profile with phases of different precision is refused by the recipe itself
    w_engine = w_dual if layout == "dual_profile" and w_dual is not None else w_split
    kv_dtype = recipe.kv_cache.dtype or activation_dtype(recipe.precision.decode, fam)
    kv_b = DTYPE_BYTES[kv_dtype]
    block_bytes = recipe.kv_cache.block_size * config.kv_bytes_per_token(kv_b)
    blocks_per_seq = _blocks_per_sequence(config, recipe.max_seq_len, recipe.kv_cache.block_size)
    num_blocks = plan_kv_num_blocks(recipe, config)
    pool_bytes = num_blocks * block_bytes
    act = activation_bytes(recipe, config, fam)
    engine = w_engine + pool_bytes + act.total_bytes
    usable = target.usable_memory_bytes
    room = usable - w_engine - act.total_bytes
    max_seqs = max(0, room // block_bytes - 1) // blocks_per_seq if room > 0 else 0
    warnings: list[EstimateWarning] = []
    notes = ["attention scores are materialized (float32, heads x max_num_tokens x max_seq_len "
             "per layer) by the " + ("ONNX Runtime CPU attention" if fam == "cpu" else
                                     "plugin-free TensorRT lowering")
             if act.scores_bytes else
             "attention scores are not materialized (online softmax in the PagedAttention "
             "plugin)"]
    if engine > usable:
        if max_seqs == 0:
            fix = (f"the weights ({_fmt_bytes(w_engine)}) and activations "
                   f"({_fmt_bytes(act.total_bytes)}) leave no room for one sequence: use int4 "
                   "weights, lower max_num_tokens, or a target with more memory")
        else:
            fix = (f"lower kv_cache.memory_budget_mib to <= {int(room // 2**20)} "
                   f"(room for {max_seqs} sequences of {recipe.max_seq_len} tokens), or use "
                   "int4 weights")
        warnings.append(EstimateWarning(
            "does_not_fit",
            f"does not fit on {target.name}: the engine needs {_fmt_bytes(engine)} (weights "
            f"{_fmt_bytes(w_engine)} + KV pool {_fmt_bytes(pool_bytes)} + activations "
            f"{_fmt_bytes(act.total_bytes)}) but {_fmt_bytes(usable)} is usable "
            f"({_fmt_bytes(target.memory_bytes)} - {_fmt_bytes(target.reserved_bytes)} "
            f"reserved). Fix: {fix}", True))

    # -- latency -----------------------------------------------------------------------------
    roof = Roofline(config, target, pre, dec, compute_dtype(recipe.precision.prefill, fam),
                    compute_dtype(recipe.precision.decode, fam), kv_b, recipe.max_num_tokens)
    rows, lat_warnings, lat_notes = _latencies(recipe, roof, report)

    return Estimate(
        recipe_name=recipe.name, model_name=config.name or "(unnamed model)", target=target,
        layout=layout, prefill=pre, decode=dec, engine_weight_bytes_split=w_split,
        engine_weight_bytes_dual_profile=w_dual, engine_weight_bytes=w_engine,
        kv_dtype=kv_dtype, kv_bytes_per_token=config.kv_bytes_per_token(kv_b),
        kv_bytes_per_token_layers=tuple(2 * h * config.head_dim * kv_b
                                        for h in config.layer_num_kv_heads),
        kv_bytes_per_sequence=kv_bytes_per_sequence(config, recipe.max_seq_len, kv_b),
        kv_block_bytes=block_bytes, kv_blocks_per_sequence=blocks_per_seq,
        kv_pool_num_blocks=num_blocks, kv_pool_bytes=pool_bytes,
        kv_pool_max_sequences=max(0, num_blocks - 1) // blocks_per_seq,
        prefill_activation_bytes=act.prefill_bytes, attention_scores_bytes=act.scores_bytes,
        decode_activation_bytes=act.decode_bytes, activation_bytes=act.total_bytes,
        engine_bytes=engine,
        engine_bytes_split=w_split + pool_bytes + act.total_bytes,
        engine_bytes_dual_profile=(None if w_dual is None
                                   else w_dual + pool_bytes + act.total_bytes),
        usable_memory_bytes=usable, fits=engine <= usable, max_sequences=max_seqs,
        latencies=tuple(rows), warnings=tuple(warnings + lat_warnings),
        notes=tuple(notes + lat_notes + list(_build_memory_note(config, target))),
        build_host_bytes=build_host_bytes(config))


def _build_memory_note(config: ModelConfig, target: TargetSpec) -> tuple[str, ...]:
    need = build_host_bytes(config)
    if need <= target.memory_bytes:
        return ()
    return (f"building needs about {_fmt_bytes(need)} of host memory (exporter / TensorRT builder peak), "
            f"more than {target.name}'s {_fmt_bytes(target.memory_bytes)}: export on a bigger machine "
            "(the build spec) and finish the plans on the target",)


# --------------------------------------------------------------------------------------------
# Model facts without weights
# --------------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def _gguf_config(path: str, mtime_ns: int, size: int) -> ModelConfig:
    # Keyed by mtime and size so an edited file is read again. GGUFReader parses the metadata
    # (most of its ~2-6 s is the tokenizer arrays) and memory-maps the tensors without reading
    # or dequantizing them.
    from gguf import GGUFReader

    from trtpipe.pipeline.gguf_loader import ModelLoadError, config_from_gguf

    try:
        reader = GGUFReader(path)
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e
    return config_from_gguf(reader, Path(path))


def model_config_for(recipe: Recipe) -> ModelConfig:
    """The model facts of ``recipe`` without loading weights: inline ``model.architecture``,
    GGUF metadata, or a Hugging Face ``config.json``. Raises RecipeError / ModelLoadError."""
    if recipe.model.architecture is not None:
        return recipe.model.architecture.to_model_config()
    src = recipe.resolve_source()
    assert src.path is not None
    if src.kind == "gguf":
        st = src.path.stat()
        return _gguf_config(str(src.path), st.st_mtime_ns, st.st_size)
    from trtpipe.pipeline.hf_loader import config_from_hf

    cfg = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
    return config_from_hf(cfg, src.path)


def _load_validate_report(recipe: Recipe, family: str, artifact_root: str | Path
                          ) -> tuple[dict | None, Path, str | None]:
    """(report or None, its path, a note when it exists but cannot be read)."""
    from trtpipe.runtime.errors import ArtifactError
    from trtpipe.runtime.report import load_report, validate_dir

    path = validate_dir(artifact_root, recipe.name, family) / "report.json"
    if not path.is_file():
        return None, path, None
    try:
        return load_report(path), path, None
    except ArtifactError as e:
        return None, path, str(e)


# --------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------

def _fmt_ms(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _fmt_flops(x: float) -> str:
    return f"{x / 1e12:.3g} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.3g} GFLOP/s"


def _weights_detail(w: PhaseWeights, recipe: Recipe, family: str) -> str:
    if w.precision == "int4":
        g = recipe.precision.int4
        codes = "int4"
        if family == "cpu" and recipe.engine.ort_float_zero_points == "int8":
            codes, fmt = "int4 as 8-bit codes", "fp32 scale + uint8 zero point"
        elif family == "cpu":
            fmt = "fp32 scale + 4-bit zero point + fp32 min"
        else:
            fmt = "fp16 scale" + ("" if g.symmetric else " + 4-bit zero point")
        lin = (f"{codes} GEMMs {_fmt_bytes(w.linear_bytes)} + {_fmt_bytes(w.int4_group_bytes)} "
               f"({fmt} per {g.group_size})")
    else:
        lin = f"{w.precision} GEMMs {_fmt_bytes(w.linear_bytes)}"
    head = ("lm_head tied" if w.lm_head_bytes == 0 else
            f"{'8-bit ' if w.precision == 'int4' and family == 'cpu' else ''}lm_head {_fmt_bytes(w.lm_head_bytes)}")
    return (f"{lin}; {w.activation_dtype} embedding {_fmt_bytes(w.embedding_bytes)}, {head}; "
            f"decode-step read {_fmt_bytes(w.step_read_bytes)}")


def render(est: Estimate, recipe: Recipe, config: ModelConfig, console: Any,
           report_path: Path | None = None) -> None:
    """Print ``est`` as rich tables (memory, latency), then notes and warnings (yellow)."""
    from rich.markup import escape
    from rich.table import Table

    tg = est.target
    cd_pre = compute_dtype(recipe.precision.prefill, tg.family)
    kind = "measured" if tg.measured else "published peak"
    console.print(f"[bold]estimate[/bold] {escape(est.recipe_name)} ({escape(est.model_name)}) "
                  f"on [bold]{escape(tg.name)}[/bold]: {escape(tg.description)}")
    console.print(
        f"  bandwidth {tg.bandwidth_bytes_per_s / 1e9:.1f} GB/s ({kind}) x "
        f"{tg.bandwidth_fraction:g} achievable; {cd_pre} "
        f"{_fmt_flops(tg.flops_per_s(cd_pre))} ({kind}) x {tg.flops_fraction:g} "
        f"achievable; memory {_fmt_bytes(tg.memory_bytes)} - "
        f"{_fmt_bytes(tg.reserved_bytes)} reserved = {_fmt_bytes(tg.usable_memory_bytes)} usable")
    console.print(f"  [dim]source: {escape(tg.source)}[/dim]")

    mem = Table(title="memory (1 MB = 10^6 B)", title_justify="left", show_lines=False)
    mem.add_column("item")
    mem.add_column("bytes", justify="right")
    mem.add_column("how")
    for ph in ("prefill", "decode"):
        w = getattr(est, ph)
        mem.add_row(f"weights, {ph} ({w.precision})", _fmt_bytes(w.total_bytes),
                    escape(_weights_detail(w, recipe, tg.family)))
    if tg.family == "cpu":
        mem.add_row("weights in the artifact", _fmt_bytes(est.engine_weight_bytes),
                    "one weights.data; identical tensors of both phases stored once")
    else:
        mark = {"split": " (recipe)" if est.layout == "split" else "",
                "dual_profile": " (recipe)" if est.layout == "dual_profile" else ""}
        mem.add_row(f"weights, split{mark['split']}", _fmt_bytes(est.engine_weight_bytes_split),
                    "two plans, each with its own copy")
        mem.add_row(f"weights, dual_profile{mark['dual_profile']}",
                    _fmt_bytes(est.engine_weight_bytes_dual_profile),
                    "one plan, one copy" if est.engine_weight_bytes_dual_profile is not None
                    else "n/a: needs the same precision in both phases")
    kvb = DTYPE_BYTES[est.kv_dtype]
    layers = est.kv_bytes_per_token_layers
    if len(set(layers)) == 1:
        how = (f"2 x {config.num_layers} layers x {config.layer_num_kv_heads[0]} kv heads x "
               f"{config.head_dim} x {kvb} B")
    else:
        groups: dict[int, int] = {}
        for b in layers:
            groups[b] = groups.get(b, 0) + 1
        how = "per layer: " + ", ".join(f"{n} layers x {b} B" for b, n in groups.items())
    mem.add_row(f"KV per token ({est.kv_dtype})", f"{est.kv_bytes_per_token:,} B", how)
    per_layer = kv_bytes_per_layer(config, recipe.max_seq_len, kvb)
    windows = sorted({w for w in config.layer_sliding_window if w > 0})
    wnote = f"; windowed layers capped at {', '.join(map(str, windows))}" if windows else ""
    if len(set(per_layer)) == 1:
        mem.add_row(f"KV per layer, {recipe.max_seq_len} tokens", _fmt_bytes(per_layer[0]),
                    f"x {config.num_layers} layers{wnote}")
    mem.add_row(f"KV per sequence ({recipe.max_seq_len} tokens)",
                _fmt_bytes(est.kv_bytes_per_sequence),
                f"{est.kv_blocks_per_sequence} blocks of {recipe.kv_cache.block_size} tokens "
                f"({_fmt_bytes(est.kv_block_bytes)} each) in the pool{wnote}")
    mem.add_row("KV pool", _fmt_bytes(est.kv_pool_bytes),
                f"{est.kv_pool_num_blocks} blocks (null block included): "
                f"{est.kv_pool_max_sequences} sequences of {recipe.max_seq_len} tokens "
                f"(max_batch_size {recipe.max_batch_size})")
    scores = (f" incl. scores {_fmt_bytes(est.attention_scores_bytes)}"
              if est.attention_scores_bytes else "")
    mem.add_row(f"activations, prefill ({recipe.max_num_tokens} tokens)",
                _fmt_bytes(est.prefill_activation_bytes),
                f"tokens x (hidden + 2 FFN + qkv) x {est.prefill.activation_dtype} + "
                f"last-token logits{scores}")
    mem.add_row(f"activations, decode (batch {recipe.max_batch_size})",
                _fmt_bytes(est.decode_activation_bytes), "batch x (hidden + 2 FFN + qkv) + logits")
    if tg.family == "cpu":
        mem.add_row("[bold]engine total[/bold]", f"[bold]{_fmt_bytes(est.engine_bytes)}[/bold]",
                    "weights + KV pool + activations")
    else:
        for lay, val in (("split", est.engine_bytes_split),
                         ("dual_profile", est.engine_bytes_dual_profile)):
            tag = " (recipe)" if lay == est.layout else ""
            mem.add_row(f"[bold]engine total, {lay}{tag}[/bold]", f"[bold]{_fmt_bytes(val)}[/bold]",
                        "weights + KV pool + activations")
    mem.add_row("host memory to build", _fmt_bytes(est.build_host_bytes),
                f"{BUILD_HOST_PEAK_FACTOR} x fp32 parameter bytes + {BUILD_HOST_BASE_BYTES // 2**20} MiB "
                "of libraries (export / TensorRT builder peak); "
                "trtpipe farm refuses nodes with less")
    verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
    mem.add_row("usable memory", _fmt_bytes(est.usable_memory_bytes),
                f"{verdict}; room for {est.max_sequences} sequences of {recipe.max_seq_len} "
                "tokens beside the weights and activations")
    console.print(mem)

    if est.latencies:
        measured = any(r.measured_ms is not None for r in est.latencies)
        lat = Table(title="latency, ms", title_justify="left",
                    caption="floor: peak rates, batch 1 (no engine is faster); predicted: "
                            "achievable rates, the scenario's decode batch, no queueing",
                    caption_justify="left")
        for col, just in (("scenario", "left"), ("metric", "left"), ("pct", "left"),
                          ("prompt", "right"), ("context", "right"), ("batch", "right"),
                          ("floor", "right"), ("predicted", "right"), ("bound", "left"),
                          ("budget", "right")):
            lat.add_column(col, justify=just)  # type: ignore[arg-type]
        if measured:
            lat.add_column("measured", justify="right")
            lat.add_column("pred/meas", justify="right")
        for r in est.latencies:
            budget = _fmt_ms(r.budget_ms)
            if r.budget_ms is not None and r.budget_ms < r.floor_ms:
                budget = f"[red]{budget}[/red]"
            elif r.budget_ms is not None and r.budget_ms < r.predicted_ms:
                budget = f"[yellow]{budget}[/yellow]"
            cells = [r.scenario, r.metric, r.percentile, str(r.prompt_tokens),
                     str(r.context_tokens) if r.metric == "tpot_ms" else "–",
                     str(r.batch) if r.metric == "tpot_ms" else "1",
                     _fmt_ms(r.floor_ms), _fmt_ms(r.predicted_ms), r.bound, budget]
            if measured:
                cells += [_fmt_ms(r.measured_ms),
                          "–" if r.ratio is None else f"{r.ratio:.2f}"]
            lat.add_row(*cells)
        console.print(lat)
        if measured and report_path is not None:
            console.print(f"  [dim]measured: {escape(str(report_path))} (calibration: "
                          "pred/meas < 1 means the model is optimistic)[/dim]")
    for n in est.notes:
        console.print(f"  [dim]note: {escape(n)}[/dim]")
    for w in est.warnings:
        console.print(f"[yellow]warning: {escape(w.message)}[/yellow]")
    if est.exit_code:
        console.print("[yellow]exit 1: the recipe does not fit or has a budget below the "
                      "physical floor[/yellow]")


def run_estimate(recipe: str | Path, target: str | None = None, as_json: bool = False, *,
                 host: HostMeasurement | None = None, artifact_root: str | Path = "artifacts",
                 console: Any = None) -> int:
    """``trtpipe estimate``: load the recipe (path or shipped name) and its model facts (no
    weights), estimate it on ``target`` (a name of the target table; default the recipe's
    target), print a rich report (or JSON with ``as_json``).

    ``host``: the cpu target's measurement (default: measured once per process). The last
    validate report of the recipe on that target, if any, is shown next to the predictions.
    Returns 0 when it fits and every budget is above its physical floor, 1 otherwise. Raises
    :class:`~trtpipe.plugins.errors.TrtpipeError` (RecipeError, ModelLoadError) for a bad
    recipe or model.
    """
    r = load_recipe(resolve_recipe_path(recipe), check_files=False)
    config = model_config_for(r)
    check_recipe_against_model(r, config)
    spec = get_target(target or r.target, host=host)
    report, report_path, report_note = _load_validate_report(r, spec.family, artifact_root)
    est = estimate(r, config, spec, report=report)
    if report_note is not None:
        est = _with_note(est, f"validate report not used: {report_note}")
    for note in _chunking_notes(r, spec.family, artifact_root):
        est = _with_note(est, note)
    if as_json:
        doc = est.to_dict()
        doc["validate_report"] = str(report_path) if report is not None else None
        out = console.file if console is not None else sys.stdout
        out.write(json.dumps(doc, indent=2) + "\n")
        return est.exit_code
    if console is None:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    render(est, r, config, console, report_path if report is not None else None)
    return est.exit_code


def _chunking_notes(recipe: Recipe, family: str, artifact_root: str | Path) -> list[str]:
    """The prefill chunk each scenario gets under ``scheduler.policy``, and why: from the
    artifact's measured step-cost model (``step_cost.json``) when there is one."""
    from trtpipe.pipeline.validate import scenario_tpot_budget_ms
    from trtpipe.runtime.report import validate_dir
    from trtpipe.runtime.slo_policy import SloChunkPolicy
    from trtpipe.runtime.step_cost import STEP_COST_FILE, StepCostModel

    path = validate_dir(artifact_root, recipe.name, family).parent / STEP_COST_FILE
    try:
        cost = StepCostModel.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        cost = None
    notes = []
    for s in recipe.validation.scenarios:
        budget = scenario_tpot_budget_ms(recipe, s)
        head = f"scenario {s.name}: prefill chunks: "
        if recipe.scheduler.policy == "fcfs" or budget is None:
            why = "scheduler.policy fcfs" if recipe.scheduler.policy == "fcfs" else "no TPOT budget"
            notes.append(head + f"fcfs ({why}), up to max_num_tokens = {recipe.max_num_tokens} per step")
        elif cost is None:
            notes.append(head + f"slo at TPOT {budget:g} ms; the chunk size comes from the engine's "
                         f"step-cost model, not measured yet ({path} is written by the first validate run)")
        else:
            notes.append(head + SloChunkPolicy(cost, budget, recipe.kv_cache.block_size,
                                               recipe.max_num_tokens).describe(recipe.max_batch_size))
    return notes


def _with_note(est: Estimate, note: str) -> Estimate:
    return dataclasses.replace(est, notes=est.notes + (note,))


__all__: Sequence[str] = (
    "Estimate", "EstimateWarning", "LatencyRow", "PhaseWeights", "estimate", "run_estimate",
    "model_config_for", "phase_weights", "engine_weight_bytes", "kv_bytes_per_layer",
    "kv_bytes_per_sequence", "prefill_flops", "decode_flops", "roofline_s", "linear_params",
    "total_params", "activation_dtype", "activation_bytes", "Activations", "Roofline",
)
