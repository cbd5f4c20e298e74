"""A step-cost model of a loaded engine: how long one scheduler step takes.

One step runs the prefill engine once (a packed batch of prompt chunks) and the decode engine
once (one token per running sequence), so its wall time is the sum of two calls, each a linear
model of the work it does (least squares over a few timed calls, :func:`~trtpipe.runtime.core.calibrate.calibrate`)::

    prefill_s(n, ctx) = p0 + p1 * n + p2 * n * (ctx + n/2)     n tokens after ctx cached ones
    decode_s(b, C)    = d0 + d1 * b + d2 * C                   b sequences, C = sum of contexts
    step_s            = prefill_s (if n > 0) + decode_s (if b > 0)

A *fused* engine (``fused``: the step's decode tokens ride in the prefill call as 1-token rows,
:class:`~trtpipe.runtime.llm.LLM`'s ``fuse_mixed_steps``) pays one call's intercept, with
coefficients of its own fit on fused calls (``fused_s``; a decode row there costs a few ms, not
a decode call's per-sequence ``d1``, which the earlier form charged)::

    step_s (n > 0, b > 0, fused) = f0 + f1 * n + p2 * n * (ctx + n/2) + f2 * b + d2 * C

``p1``/``d1`` are the weight-bound GEMM terms, ``p2``/``d2`` the attention terms (a chunk's
queries read ``ctx + n/2`` keys on average). The model's stated error is measured on calls that
were not used to fit it (``error_ms``: the largest absolute miss on those held-out calls, and
``rel_error``: the largest relative miss), so a scheduler that keeps ``predicted <= budget``
keeps ``measured <= budget + error_ms`` as far as the held-out calls go.

The model is kept with the artifact (``step_cost.json`` next to ``manifest.json``) with the
host and CPU (:func:`~trtpipe.runtime.artifact.host_cpu.host_id`: machines share a host name, not a CPU)
and thread count it was measured on; :func:`~trtpipe.runtime.core.calibrate.load_or_calibrate` reuses it only there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

STEP_COST_FILE = "step_cost.json"
FORMAT_VERSION = 3  # 2: the ``fused`` field; 3: ``fused_s`` (older files are measured again)


class StepSample(NamedTuple):
    """One scheduled step as the slo policy saw it: the model's prediction, the wall time, what
    the step carried, and the host factor the policy planned with (predicted x factor = planned)."""

    predicted_s: float
    measured_s: float
    prefill_tokens: int
    decode_batch: int
    host_factor: float


@dataclass(frozen=True)
class StepCostModel:
    """Coefficients in seconds (see the module docstring); ``error_ms`` / ``rel_error`` from
    held-out calls; ``host``/``num_threads`` say where it was measured."""

    prefill_s: tuple[float, float, float]  # p0 [s], p1 [s/token], p2 [s/(token*key)]
    decode_s: tuple[float, float, float]  # d0 [s], d1 [s/sequence], d2 [s/context token]
    error_ms: float = 0.0
    rel_error: float = 0.0
    host: str = ""
    num_threads: int | None = None
    calibration_s: float = 0.0
    fused: bool = False  # mixed steps are one prefill call (see the module docstring)
    engine: str = ""  # the engine measured ("native", "ort", "trt"): each has its own costs
    fused_s: tuple[float, float, float] | None = None  # f0 [s], f1 [s/prompt token], f2 [s/decode row]

    def prefill_time_s(self, num_tokens: int, context: int = 0) -> float:
        """Predicted prefill call time for ``num_tokens`` tokens after ``context`` computed ones."""
        if num_tokens <= 0:
            return 0.0
        p0, p1, p2 = self.prefill_s
        return p0 + p1 * num_tokens + p2 * num_tokens * (context + num_tokens / 2)

    def predict_step_s(self, step: Any) -> float:
        """Predicted time of a :class:`~trtpipe.runtime.sched.step.SchedulerStep` (seconds); a
        speculative verify row (a decode with proposed tokens) runs as a prefill chunk."""
        chunks = [(p.num_tokens, p.start_position) for p in step.prefills]
        chunks += [(d.num_tokens, d.position) for d in step.decodes if d.num_tokens > 1]
        plain = [d for d in step.decodes if d.num_tokens == 1]
        return self.step_time_s(chunks, len(plain), sum(d.context_len for d in plain))

    def prefill_chunks_time_s(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Predicted time of one prefill call packing ``(num_tokens, context)`` chunks."""
        chunks = [(n, c) for n, c in chunks if n > 0]
        if not chunks:
            return 0.0
        p0, p1, p2 = self.prefill_s
        return p0 + sum(p1 * n + p2 * n * (c + n / 2) for n, c in chunks)

    def decode_time_s(self, batch: int, context_sum: int) -> float:
        """Predicted decode call time for ``batch`` sequences holding ``context_sum`` tokens."""
        if batch <= 0:
            return 0.0
        d0, d1, d2 = self.decode_s
        return d0 + d1 * batch + d2 * context_sum

    def step_time_s(self, chunks: Sequence[tuple[int, int]], batch: int, context_sum: int) -> float:
        """Predicted time of a step running prefill ``chunks`` (``(num_tokens, context)`` each)
        and ``batch`` decodes holding ``context_sum`` tokens: two calls, or one when ``fused``."""
        prefill = self.prefill_chunks_time_s(chunks)
        if prefill == 0.0 or batch <= 0 or not self.fused:
            return prefill + self.decode_time_s(batch, context_sum)
        _d0, d1, d2 = self.decode_s
        if self.fused_s is None:
            return prefill + d1 * batch + d2 * context_sum
        f0, f1, f2 = self.fused_s
        p2 = self.prefill_s[2]
        tokens = sum(f1 * n + p2 * n * (c + n / 2) for n, c in chunks if n > 0)
        return f0 + tokens + f2 * batch + d2 * context_sum

    def to_json(self) -> str:
        return json.dumps({"format_version": FORMAT_VERSION, **asdict(self)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> StepCostModel:
        d = json.loads(text)
        if d.pop("format_version", None) != FORMAT_VERSION:
            raise ValueError("step_cost.json: unknown format_version")
        d["prefill_s"] = tuple(d["prefill_s"])
        d["decode_s"] = tuple(d["decode_s"])
        if d.get("fused_s") is not None:
            d["fused_s"] = tuple(d["fused_s"])
        return cls(**d)


def fit(
    prefill_samples: Sequence[tuple[int, int, float]], decode_samples: Sequence[tuple[int, int, float]]
) -> StepCostModel:
    """Least-squares fit of both calls; coefficients clamped at >= 0 (time never falls with work).

    ``prefill_samples``: ``(num_tokens, context, seconds)``; ``decode_samples``: ``(batch,
    context_sum, seconds)``. Needs at least 3 distinct samples of each.
    """

    p = _solve([[1.0, n, n * (c + n / 2)] for n, c, _ in prefill_samples], [s for *_, s in prefill_samples])
    d = _solve([[1.0, b, c] for b, c, _ in decode_samples], [s for *_, s in decode_samples])
    return StepCostModel(prefill_s=p, decode_s=d)


def fit_fused(model: StepCostModel, samples: Sequence[tuple[int, int, int, int, float]]) -> StepCostModel:
    """``model`` with ``fused=True`` and ``fused_s`` fit (least squares, clamped like :func:`fit`)
    on fused mixed calls ``(num_tokens, context, batch, context_sum, seconds)``, after taking out
    the attention terms of the separate fits (``p2``, ``d2``). Needs 3 distinct samples."""
    p2, d2 = model.prefill_s[2], model.decode_s[2]
    rows = [[1.0, n, b] for n, _c, b, _cs, _s in samples]
    y = [s - p2 * n * (c + n / 2) - d2 * cs for n, c, _b, cs, s in samples]
    return StepCostModel(**{**asdict(model), "fused": True, "fused_s": _solve(rows, y)})


def _solve(rows: list[list[float]], y: list[float]) -> tuple[float, float, float]:
    a, b = np.asarray(rows, np.float64), np.asarray(y, np.float64)
    coef = np.linalg.lstsq(a, b, rcond=None)[0]
    coef = np.maximum(coef, 0.0)
    # Refit the intercept after clamping, so the model passes through the data's mean.
    coef[0] = max(0.0, float(np.mean(b - a[:, 1:] @ coef[1:])))
    return tuple(float(c) for c in coef)  # type: ignore[return-value]


def with_error(
    model: StepCostModel,
    prefill_held: Sequence[tuple[int, int, float]],
    decode_held: Sequence[tuple[int, int, float]],
    fused_held: Sequence[tuple[int, int, int, int, float]] = (),
    **facts: Any,
) -> StepCostModel:
    """``model`` with ``error_ms``/``rel_error`` measured on held-out calls (and extra facts).

    ``fused_held``: ``(num_tokens, context, batch, context_sum, seconds)`` of fused mixed calls,
    judged by ``step_time_s`` of the model with the facts applied (``fused=True``)."""
    model = StepCostModel(**{**asdict(model), **facts})
    misses = [(model.prefill_time_s(n, c), s) for n, c, s in prefill_held]
    misses += [(model.decode_time_s(b, c), s) for b, c, s in decode_held]
    misses += [(model.step_time_s([(n, c)], b, cs), s) for n, c, b, cs, s in fused_held]
    err = max((abs(p - s) for p, s in misses), default=0.0)
    rel = max((abs(p - s) / s for p, s in misses if s > 0), default=0.0)
    return StepCostModel(**{**asdict(model), "error_ms": err * 1e3, "rel_error": rel})


def fastest_s(call: Callable[[Any], object], batch: Any, repeats: int) -> float:
    """The fastest of ``repeats`` timed ``call(batch)`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        call(batch)
        best = min(best, time.perf_counter() - t)
    return best


__all__ = ["STEP_COST_FILE", "StepCostModel", "StepSample", "fastest_s", "fit", "fit_fused", "with_error"]
