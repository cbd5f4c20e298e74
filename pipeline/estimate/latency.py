"""Roofline latencies of a recipe's scenarios: TTFT and TPOT at each budgeted percentile.

A step takes ``max(FLOP / FLOP/s, bytes / (bytes/s))``: at achievable rates for the prediction
(the scenario's decode batch), at peak rates and batch 1 for the physical floor (a budget below it
cannot be met by any engine). Prompt and output lengths at a percentile come from the scenario's
distribution (fixed, or discrete uniform); prompts from a file have no length before tokenization.
A decode step reads what :class:`~trtpipe.runtime.metrics.decode_bandwidth.DecodeReadModel` counts, the
same bytes the runtime divides by TPOT to report achieved bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from trtpipe.pipeline.estimate.model_counts import decode_flops, kv_bytes_per_sequence, prefill_flops
from trtpipe.pipeline.estimate.notices import EstimateWarning
from trtpipe.pipeline.estimate.units import fmt_ms
from trtpipe.pipeline.estimate.weights import PhaseWeights
from trtpipe.pipeline.recipe import Recipe, Scenario
from trtpipe.pipeline.targets import TargetSpec
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.kv.planning import cdiv
from trtpipe.runtime.metrics.decode_bandwidth import DecodeReadModel


def roofline_s(flops: float, num_bytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """Time of a step bound by compute or memory, whichever is slower (the roofline)."""
    return max(flops / flops_per_s, num_bytes / bytes_per_s)


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
    kv_dtype: str  # fp32 | fp16 | bf16 | int8
    max_num_tokens: int

    @cached_property
    def decode_read(self) -> DecodeReadModel:
        """Bytes one decode step reads (weights once, each sequence's KV once)."""
        c = self.config
        return DecodeReadModel(
            self.decode.step_read_bytes,
            self.kv_dtype,
            c.head_dim,
            tuple(c.layer_num_kv_heads),
            tuple(c.layer_sliding_window),
            "estimate",
        )

    def _time(self, flops: float, nbytes: float, dtype: str, peak: bool) -> tuple[float, str]:
        tg = self.target
        fl = tg.flops_per_s(dtype) if peak else tg.achievable_flops_per_s(dtype)
        bw = tg.bandwidth_bytes_per_s if peak else tg.achievable_bandwidth_bytes_per_s
        return roofline_s(flops, nbytes, fl, bw), ("compute" if flops / fl >= nbytes / bw else "memory")

    def ttft_s(self, prompt_tokens: int, peak: bool = False) -> tuple[float, str]:
        """Prefill of one prompt from position 0: its FLOP; the weights read once per chunk of
        ``max_num_tokens`` plus the KV written."""
        chunks = cdiv(prompt_tokens, self.max_num_tokens)
        nbytes = chunks * self.prefill.step_read_bytes + kv_bytes_per_sequence(
            self.config, prompt_tokens, self.kv_dtype
        )
        return self._time(prefill_flops(self.config, prompt_tokens), nbytes, self.prefill_compute_dtype, peak)

    def tpot_s(self, context_tokens: int, batch: int = 1, peak: bool = False) -> tuple[float, str]:
        """One decode step of ``batch`` sequences at ``context_tokens``: the decode weights
        read once, each sequence's KV read once."""
        return self._time(
            batch * decode_flops(self.config, context_tokens),
            self.decode_read.step_read_bytes(context_tokens, batch),
            self.decode_compute_dtype,
            peak,
        )


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


def scenario_lengths(s: Scenario, q: float) -> tuple[int, int] | None:
    """(prompt, output) tokens at quantile q; None for a prompt file (lengths unknown)."""
    p, o = s.prompt_tokens, s.output_tokens
    if p.file is not None:
        return None
    pu, ou = p.uniform, o.uniform
    prompt = _quantile_tokens(p.fixed, pu.min if pu else None, pu.max if pu else None, q)
    out = _quantile_tokens(o.fixed, ou.min if ou else None, ou.max if ou else None, q)
    return prompt, out


def decode_batch(s: Scenario, recipe: Recipe, roof: Roofline) -> int:
    """Sequences decoding together: the clients of a closed loop; for Poisson arrivals,
    Little's law (rate x the unloaded request time at p50 lengths); capped by max_batch_size."""
    if s.concurrency is not None:
        return min(s.concurrency, recipe.max_batch_size)
    lengths = scenario_lengths(s, 0.5)
    assert lengths is not None and s.arrival_rate_per_s is not None
    prompt, out = lengths
    e2e = roof.ttft_s(prompt)[0] + out * roof.tpot_s(prompt + out // 2)[0]
    return max(1, min(recipe.max_batch_size, round(s.arrival_rate_per_s * e2e)))


def _row(
    s: Scenario,
    metric: str,
    pct: str,
    recipe: Recipe,
    roof: Roofline,
    batch: int,
    budget: float | None,
    measured: float | None,
) -> tuple[LatencyRow, str]:
    """One latency row and what its floor assumes (for warnings)."""
    lengths = scenario_lengths(s, _pct_fraction(pct))
    assert lengths is not None
    prompt, out = lengths
    if metric == "ttft_ms":
        ctx, b, what = prompt, 1, f"prefill of {prompt} tokens"
        floor, _ = roof.ttft_s(prompt, peak=True)
        pred, bound = roof.ttft_s(prompt)
    else:
        ctx, b, what = min(prompt + max(1, out // 2), recipe.max_seq_len), batch, f"decode at {prompt + 1} tokens"
        floor, _ = roof.tpot_s(prompt + 1, 1, peak=True)
        pred, bound = roof.tpot_s(ctx, b)
    return LatencyRow(s.name, metric, pct, prompt, ctx, b, floor * 1e3, pred * 1e3, bound, budget, measured), what


def budget_warning(row: LatencyRow, where: str, what: str, target: TargetSpec) -> EstimateWarning | None:
    """A failing warning for a budget below the physical floor, a non-failing one for a budget
    below the prediction; None when the budget is above both (or there is none)."""
    budget = row.budget_ms
    if budget is None:
        return None
    if budget < row.floor_ms:
        return EstimateWarning(
            "budget_below_floor",
            f"{where} is below the physical floor {fmt_ms(row.floor_ms)} ms on {target.name} ({what}, batch 1, "
            f"at peak FLOP/s and bandwidth): no engine can meet it. Fix: raise it to >= {math.ceil(row.floor_ms)} "
            "ms, use lower-precision weights, or a faster target",
            True,
        )
    if budget >= row.predicted_ms:
        return None
    return EstimateWarning(
        "budget_below_prediction",
        f"{where} is below the predicted {fmt_ms(row.predicted_ms)} ms on {target.name} ({row.bound}-bound at "
        f"{target.flops_fraction:g} of peak FLOP/s and {target.bandwidth_fraction:g} of peak bandwidth, batch "
        f"{row.batch}): it may fail validate",
        False,
    )


def latencies(
    recipe: Recipe, roof: Roofline, report: dict | None
) -> tuple[list[LatencyRow], list[EstimateWarning], list[str]]:
    """One row per scenario, metric (TTFT, TPOT) and percentile (p50 and every budgeted one);
    a warning per budget below its floor (fails) or below the prediction (does not fail).
    ``report``: a validate report.json document whose measured percentiles join the rows."""
    measured = {s.get("name"): s.get("summary") or {} for s in (report or {}).get("scenarios", [])}
    rows: list[LatencyRow] = []
    warnings: list[EstimateWarning] = []
    notes: list[str] = []
    for i, s in enumerate(recipe.validation.scenarios):
        if scenario_lengths(s, 0.5) is None:
            notes.append(
                f"scenario {s.name}: prompts come from a file; lengths unknown before tokenization, no latency estimate"
            )
            continue
        budgets = {(m, p): v for m, p, v in s.budgets.limits()}
        batch = decode_batch(s, recipe, roof)
        for metric in ("ttft_ms", "tpot_ms"):
            for pct in ["p50"] + [p for (m, p) in budgets if m == metric and p != "p50"]:
                got = measured.get(s.name, {}).get(metric)
                meas = got.get(pct) if isinstance(got, dict) else None
                budget = budgets.get((metric, pct))
                row, what = _row(s, metric, pct, recipe, roof, batch, budget, None if meas is None else float(meas))
                rows.append(row)
                if budget is None:
                    continue
                where = f"validate.scenarios[{i}] ({s.name}) budgets.{metric}.{pct} = {budget:g} ms"
                if (w := budget_warning(row, where, what, roof.target)) is not None:
                    warnings.append(w)
    return rows, warnings, notes
