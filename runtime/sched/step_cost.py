"""A step-cost model of a loaded engine: how long one scheduler step takes.

One step runs the prefill engine once (a packed batch of prompt chunks) and the decode engine
once (one token per running sequence), so its wall time is the sum of two calls, each a linear
model of the work it does (least squares over a few timed calls, :func:`calibrate`)::

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
and thread count it was measured on; :func:`load_or_calibrate` reuses it only there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from trtpipe.runtime.artifact.host_cpu import host_id
from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.planning import cdiv

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


# ---- measuring a real engine -----------------------------------------------------------------

# (tokens, context) prefill calls and (batch, context per sequence) decode calls: fit / held out.
# Prefill points are the chunk sizes the slo policy chooses between (a step next to decodes
# carries 16-100 tokens): a fit that included 192-token calls gave intercept 0 and 2.6 ms/token on a
# Zen 3 host, under-predicting a 16-token call by ~40 % (46-70 ms measured, 41 predicted).
PREFILL_FIT = ((8, 0), (16, 0), (32, 0), (64, 0), (96, 0), (32, 384))
PREFILL_HELD = ((24, 0), (48, 128))
DECODE_FIT = ((1, 32), (4, 32), (8, 32), (4, 256))
DECODE_HELD = ((2, 128), (6, 64))
# (chunk tokens, chunk context, decodes, context per decode): fused mixed calls, fit / held out;
# the chunk sizes the slo policy picks next to 1-4 decodes
FUSED_FIT = ((8, 0, 1, 64), (16, 0, 1, 64), (32, 0, 1, 64), (16, 0, 4, 64), (48, 0, 2, 128), (32, 256, 2, 256))
FUSED_HELD = ((16, 128, 2, 128), (48, 0, 4, 64))
# Each call timed this many times, the fastest kept: with 2, a calibration on the shared 2-core
# Zen 3 host (2026-12-01 17:50) fit a 33 ms prefill intercept with a 41 ms (48 %) held-out error,
# against 15 ms and 7.4 ms (19 %) the day before on the same CPU.
CALIBRATION_REPEATS = 3


def calibrate(
    engine: Any,
    block_pool: Any,
    block_size: int,
    max_num_tokens: int,
    max_batch_size: int,
    *,
    repeats: int = CALIBRATION_REPEATS,
    fused: bool = False,
) -> StepCostModel:
    """Time a few prefill and decode calls of ``engine`` and fit a :class:`StepCostModel`.

    ``fused``: the runtime fuses mixed steps; fused calls are timed too (``FUSED_FIT`` for
    ``fused_s``, :func:`fit_fused`; ``FUSED_HELD`` count in the stated error).

    The calls write dummy KV into blocks taken from ``block_pool`` with ``allocate`` (so no
    block any request owns, and no cached block, is touched; cached ones are evicted) and given
    back uncached afterwards. Each call is timed ``repeats`` times; the fastest counts (the
    machine's noise only ever adds time). Takes 3-5 seconds on the 2-core CPU host.
    """
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

    t_start = time.perf_counter()
    max_b = min(max_batch_size, max(b for b, _ in DECODE_FIT + DECODE_HELD))
    ids, tables = _reserve_block_tables(block_pool, block_size, max_b)

    def slots(table, start, n):
        return tuple(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))

    def timed(call, rows) -> float:
        return fastest_s(call, rows, repeats)

    def chunk(n, c):  # n tokens after c in row 0
        return ScheduledPrefill("cal", (1,) * n, c, tables[0], slots(tables[0], c, n), True)

    def dec(i, c):  # the token after c in row i
        return ScheduledDecode(f"cal{i}", 1, c, tables[i], slots(tables[i], c, 1)[0])

    def prefill(points):
        calls = [(min(n, max_num_tokens), c) for n, c in points]
        return [(n, c, timed(engine.prefill, PrefillBatch.from_scheduled([chunk(n, c)]))) for n, c in calls]

    def decode(points):
        calls = [(min(b, max_b), c) for b, c in points]
        return [
            (b, b * (c + 1), timed(engine.decode, DecodeBatch.from_scheduled([dec(i, c) for i in range(b)])))
            for b, c in calls
        ]

    def mixed(points):  # chunk in row 0, decodes in rows 1..b, one prefill call
        out = []
        for n, c, b, dc in points if fused else ():
            b = min(b, max_b - 1)
            rows = [chunk(n, c)] + [dec(i, dc).as_prefill_chunk() for i in range(1, b + 1)]
            out.append((n, c, b, b * (dc + 1), timed(engine.prefill, PrefillBatch.from_scheduled(rows))))
        return out

    try:
        timed(engine.prefill, PrefillBatch.from_scheduled([chunk(8, 0)]))  # warm-up
        model = fit(prefill(PREFILL_FIT), decode(DECODE_FIT))
        if fused:
            model = fit_fused(model, mixed(FUSED_FIT))
        held_p, held_d, held_f = prefill(PREFILL_HELD), decode(DECODE_HELD), mixed(FUSED_HELD)
    finally:
        block_pool.free(ids)
    facts = {"host": host_id(), "fused": fused, "calibration_s": round(time.perf_counter() - t_start, 3)}
    return with_error(model, held_p, held_d, held_f, **facts)


def fastest_s(call: Any, batch: Any, repeats: int) -> float:
    """The fastest of ``repeats`` timed ``call(batch)`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        call(batch)
        best = min(best, time.perf_counter() - t)
    return best


def _reserve_block_tables(block_pool: Any, block_size: int, max_b: int) -> tuple[list[int], list[tuple[int, ...]]]:
    """Allocate the calibration's block tables: row 0 long enough for every prefill point, rows
    1..max_b-1 for the decode points. Returns (all block ids, tables). Raises
    :class:`TrtpipeError` when the pool has too few free blocks."""
    prefill_blocks = cdiv(max(n + c for n, c in PREFILL_FIT + PREFILL_HELD), block_size)
    decode_blocks = cdiv(max(c for _, c in DECODE_FIT + DECODE_HELD) + 1, block_size)
    sizes = [max(prefill_blocks, decode_blocks)] + [decode_blocks] * (max_b - 1)
    ids = block_pool.allocate(sum(sizes))
    if ids is None:
        raise TrtpipeError(
            f"step-cost calibration needs {sum(sizes)} free KV blocks, the pool has "
            f"{block_pool.num_free}; fix: run it between requests, or give the pool more blocks "
            "(kv_cache.num_blocks), or use runtime.scheduler.policy: fcfs"
        )
    tables, at = [], 0
    for size in sizes:
        tables.append(tuple(ids[at : at + size]))
        at += size
    return ids, tables


# A calibration whose held-out error exceeds RECALIBRATE_REL_ERROR is repeated, up to
# CALIBRATION_ATTEMPTS in all, and the fit with the smallest error is used; only a fit within
# MAX_STORED_REL_ERROR is kept in the artifact and reused by later loads (a worse one was measured
# on a busy host: the next load measures again). Between the two bounds the best fit is stored:
# a host that gave nothing better in three attempts is unlikely to at the next start, which would
# otherwise pay three calibrations (~12 s on 2 cores) every time. Measured on the quiet 2-core
# Zen 4 (2026-12-03): good fits are off by 13-19 % of a step; a busy start fit one off by 77 %
# (a 13 ms fused decode row against ~0.7 ms), whose steps made the server raise its derived TPOT
# budget from 50 to 78.9 ms.
RECALIBRATE_REL_ERROR = 0.35
CALIBRATION_ATTEMPTS = 3
MAX_STORED_REL_ERROR = 0.5


def load_or_calibrate(
    artifact_dir: str | os.PathLike,
    engine: Any,
    block_pool: Any,
    block_size: int,
    max_num_tokens: int,
    max_batch_size: int,
    num_threads: int | None,
    *,
    fused: bool = False,
    log=None,
) -> StepCostModel:
    """The artifact's ``step_cost.json`` when it was measured on this host and CPU
    (:func:`~trtpipe.runtime.artifact.host_cpu.host_id`) with these threads, the same ``fused`` and the same
    engine (``engine.backend``); else calibrate now and write it there (atomically; a read-only
    artifact just skips the write). A calibration off by more than RECALIBRATE_REL_ERROR on its
    held-out calls is repeated (CALIBRATION_ATTEMPTS in all, ~4 s each on 2 cores) and the best
    fit used; one still off by more than MAX_STORED_REL_ERROR (a busy host) is used but not
    written, so the next load measures again. A stored file off by more than that (written under
    an older, looser bound) is measured again too."""
    from trtpipe.runtime.artifact.manifest import atomic_write_text

    path = Path(artifact_dir) / STEP_COST_FILE
    if path.is_file():
        try:
            model = StepCostModel.from_json(path.read_text(encoding="utf-8"))
            same_engine = model.engine == getattr(engine, "backend", "")
            same_setup = model.host == host_id() and model.num_threads == num_threads and model.fused == fused
            if same_setup and same_engine and model.rel_error <= MAX_STORED_REL_ERROR:
                return model
        except (ValueError, KeyError, TypeError):
            pass  # unreadable or old: measure again
    tries: list[StepCostModel] = []
    while len(tries) < CALIBRATION_ATTEMPTS and (not tries or tries[-1].rel_error > RECALIBRATE_REL_ERROR):
        tries.append(calibrate(engine, block_pool, block_size, max_num_tokens, max_batch_size, fused=fused))
    model = min(tries, key=lambda m: m.rel_error)
    facts = {"num_threads": num_threads, "engine": getattr(engine, "backend", "")}
    if len(tries) > 1:
        facts["calibration_s"] = round(sum(m.calibration_s for m in tries), 3)
    model = StepCostModel(**{**asdict(model), **facts})
    if log is not None:
        errors = ", ".join(f"{m.rel_error:.0%}" for m in tries)
        best_of = f", best of {len(tries)} calibrations (errors {errors})" if len(tries) > 1 else ""
        log(f"step-cost model measured in {model.calibration_s:.1f} s (error {model.error_ms:.1f} ms{best_of})")
    if model.rel_error > MAX_STORED_REL_ERROR:  # measured on a busy host: use it now, measure again next load
        if log is not None:
            log(f"step-cost model not stored: relative error {model.rel_error:.0%} (the host was busy)")
        return model
    try:
        atomic_write_text(path, model.to_json())
    except OSError:
        pass
    return model


__all__ = [
    "CALIBRATION_ATTEMPTS",
    "MAX_STORED_REL_ERROR",
    "RECALIBRATE_REL_ERROR",
    "STEP_COST_FILE",
    "StepCostModel",
    "calibrate",
    "fastest_s",
    "fit",
    "fit_fused",
    "load_or_calibrate",
    "with_error",
]
