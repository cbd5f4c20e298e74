"""SLO-aware prefill chunk sizing: keep every decoding request within the TPOT budget.

Follows Sarathi-Serve (Agrawal et al., OSDI 2024, "stall-free batching"): a step carries every
running decode plus as many prefill tokens as fit a *token budget* derived from the
time-between-tokens target. Here the budget comes from a measured :class:`StepCostModel` of the
built engine instead of a profiled constant, and it is recomputed every step from what that
step decodes::

    limit_s    = step cap                       TPOT budget B; with an ITL budget:
                                                ITL_BUDGET_MARGIN x the ITL budget
    limit_s    = min(limit_s, slack of every decoding request r)
    slack_r    = B * (k_r + R_r) - T_r - (R_r - 1) * d
                 (k_r gaps so far took T_r seconds; R_r tokens still to come, this step's
                 included; d = the predicted decode-only step): the longest step after which
                 r's TPOT still ends <= B if its later steps decode only
    chunk      = the most tokens n with
                 host_factor * cost.step_time_s([(n, prefill_context)], decodes, ctx) <= limit_s
                 (two engine calls, or one where the engine fuses them; host_factor: measured /
                 predicted over recent steps, the host's speed now against the calibration's,
                 kept current by LLM; d above is scaled by it too)
    chunk      = max(chunk, block_size)          never below one block: prefill always advances
    no decodes -> chunk = max_num_tokens         nobody's ITL is at stake; TTFT wants big chunks

With an ITL-during-prefill ratio ``q`` (the decoding requests' gap while others prefill, over
their steady gap: onnxruntime-genai's engine-benchmark gate, validate's
``itl_during_prefill_ratio`` budget) the step is also held to ``q`` times the predicted
decode-only step of the same decodes, and the chunk floor is one token instead of one block::

    limit_s    = min(limit_s, q * d_now)         d_now = host_factor * cost.decode_time_s(decodes)
    chunk      = max(chunk, 1)

On a CPU a prompt token beside a decode costs about a quarter of a decode step (docs/server.md
gives the measured step costs, ``bench/prefill_chunk_sweep.py`` measures them), so q = 1.5 allows
2-3 prompt tokens a step: decodes keep their pace and a long prompt that arrives meanwhile takes
several times its TTFT alone. A ratio below what one prompt token costs cannot be kept (the floor
runs anyway); :meth:`SloChunkPolicy.describe` says so. The ratio trades the partner's TTFT for
the decoders' ITL; without it the TPOT/ITL budgets set the chunk. It holds only steps taken while
a prompt waits or prefills: otherwise the cap sizes speculative drafts alone, which keep the
budgets' size.

TPOT is a mean over a request's token gaps, so a request whose earlier gaps were short may take
one long step: with an ITL budget (the longest gap a client accepts) the policy spends that
slack on bigger chunks, which pay the per-call cost fewer times and so cut the prompt's TTFT.
Without one every step stays within B, so every gap does (up to the model's error). ``R_r``
counts up to ``max_new_tokens``: a request that stops at EOS much earlier can end above B, by at
most the step cap.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.sched.step import DecodeProgress
from trtpipe.runtime.sched.step_cost import StepCostModel, StepSample

# The policy plans with the step-cost model scaled by the host's speed now: the median measured /
# predicted time of the last HOST_FACTOR_WINDOW mixed steps, the kind it plans (once
# HOST_FACTOR_MIN_STEPS ran; decode-only steps are not planned and can be predicted well while
# mixed ones are not). A shared
# host drifts 20-50 % within minutes; a model calibrated at a quiet moment then plans steps that
# run over the budget (measured: 16-token steps predicted 60 ms ran 74-93 ms).
HOST_FACTOR_WINDOW = 32
HOST_FACTOR_MIN_STEPS = 8

# A step predicted at this fraction of the ITL budget lands within it despite the cost model's
# error: its relative error on slo-scheduled SmolLM2 steps was p50 13 %, p90 24 % (docs/server.md).
ITL_BUDGET_MARGIN = 0.8


_BUDGET_FIX = {
    "tpot_budget_ms": "give the TPOT budget in ms (the mean token gap a request may take), e.g. tpot_budget_ms=50 (recipe "
    "runtime.scheduler.tpot_budget_ms: 50, serve --tpot-budget-ms 50), or use runtime.scheduler.policy: fcfs",
    "itl_budget_ms": "give the ITL budget in ms (the longest token gap a client accepts), e.g. itl_budget_ms=100 (recipe "
    "runtime.scheduler.itl_budget_ms: 100, serve --itl-budget-ms 100), or None for every step within the TPOT budget",
}


def check_budget_ms(name: str, value: object) -> None:
    """Raise :class:`TrtpipeError` unless ``value`` is a finite number of milliseconds > 0
    (an int or float, NumPy's included; not a bool or a string). ``name``: ``tpot_budget_ms`` or ``itl_budget_ms``."""
    number = _finite_number(value)
    if number is None or number <= 0:
        raise TrtpipeError(f"{name} = {value!r}: expected a finite number of ms > 0; fix: {_BUDGET_FIX[name]}")


def _finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (NumPy's included), not a bool or a
    string; else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        return float(value)
    return None


@dataclass(frozen=True)
class SloChunkPolicy:
    """Prefill tokens allowed in one step under ``tpot_budget_ms`` (and ``itl_budget_ms``, and the
    ``itl_during_prefill_ratio``; module doc).

    Raises :class:`TrtpipeError` for a budget that is not a finite number > 0 (:func:`check_budget_ms`),
    a ratio that is not a finite number > 1 (:func:`check_itl_ratio`) or sizes < 1.
    """

    cost: StepCostModel
    tpot_budget_ms: float
    block_size: int
    max_num_tokens: int
    itl_budget_ms: float | None = None  # None: every step within the TPOT budget
    host_factor: float = 1.0  # measured / predicted step time of recent steps (LLM updates it)
    itl_during_prefill_ratio: float | None = None  # None: the budgets alone set the chunk (module doc)

    def __post_init__(self) -> None:
        check_budget_ms("tpot_budget_ms", self.tpot_budget_ms)
        if self.itl_budget_ms is not None:
            check_budget_ms("itl_budget_ms", self.itl_budget_ms)
        if self.itl_during_prefill_ratio is not None:
            check_itl_ratio(self.itl_during_prefill_ratio)
        if self.block_size < 1 or self.max_num_tokens < 1:
            raise TrtpipeError(
                f"block_size = {self.block_size}, max_num_tokens = {self.max_num_tokens}: expected both >= 1"
            )

    @property
    def step_cap_s(self) -> float:
        """The longest step this policy plans [s]: the TPOT budget, or with an ITL budget
        ``ITL_BUDGET_MARGIN`` x that budget."""
        if self.itl_budget_ms is None:
            return self.tpot_budget_ms / 1e3
        return ITL_BUDGET_MARGIN * self.itl_budget_ms / 1e3

    def step_limit_s(
        self,
        num_decodes: int,
        decode_context_sum: int,
        progress: Sequence[DecodeProgress] = (),
        prefill_pending: bool = True,
    ) -> float:
        """The longest step allowed now [s]: the step cap, lowered to the ITL-during-prefill
        ratio's limit (only while a prompt waits or prefills: ``prefill_pending``; a step of
        decodes and speculative verifies alone keeps the budgets') and to the smallest slack of
        ``progress`` (see the module doc)."""
        budget_s = self.tpot_budget_ms / 1e3
        decode_s = self.host_factor * self.cost.decode_time_s(num_decodes, decode_context_sum)
        limit = self.step_cap_s
        if self.itl_during_prefill_ratio is not None and num_decodes > 0 and prefill_pending:
            limit = min(limit, self.itl_during_prefill_ratio * decode_s)
        for p in progress:
            remaining = max(1, p.remaining_tokens)
            slack = budget_s * (p.num_itl + remaining) - p.itl_sum_s - (remaining - 1) * decode_s
            limit = min(limit, slack)
        return limit

    def max_prefill_tokens(
        self,
        num_decodes: int,
        decode_context_sum: int,
        prefill_context: int = 0,
        progress: Sequence[DecodeProgress] = (),
        prefill_pending: bool = True,
    ) -> int:
        """Prefill tokens for a step that decodes ``num_decodes`` sequences (see module doc); the
        scheduler also spends them on speculative drafts, which the ratio leaves alone when no
        prompt is pending (``prefill_pending`` False, :meth:`step_limit_s`)."""
        if num_decodes == 0:
            return self.max_num_tokens
        limit_s = self.step_limit_s(num_decodes, decode_context_sum, progress, prefill_pending)
        room = max(0, self.max_num_tokens - num_decodes)  # the step budget also carries the decodes
        lo, hi = 0, room
        while lo < hi:  # step time grows with n: the largest n with time(n) <= limit
            mid = (lo + hi + 1) // 2
            step_s = self.host_factor * self.cost.step_time_s([(mid, prefill_context)], num_decodes, decode_context_sum)
            if step_s <= limit_s:
                lo = mid
            else:
                hi = mid - 1
        return max(self.min_chunk_tokens, lo)

    def _ratio_unmet(self, batches: Sequence[int], context: int) -> str:
        """'' when one prompt token beside each of ``batches`` decodes (``context`` tokens each)
        fits the ratio by the model, else a note naming the batches where such steps run over it
        (the chunk floor is one token)."""
        over = []
        for b in batches:
            decode = self.cost.decode_time_s(b, b * context)
            one = self.cost.step_time_s([(1, context)], b, b * context) / decode if decode > 0 else float("inf")
            if self.itl_during_prefill_ratio is not None and one > self.itl_during_prefill_ratio + 1e-9:
                over.append(f"{b} -> {one:.2f}x")
        if not over:
            return ""
        return f" (unmet: one prompt token beside n decodes already takes, by the model, {', '.join(over)})"

    @property
    def min_chunk_tokens(self) -> int:
        """The chunk floor beside decodes: one block, or one token with an ITL-during-prefill ratio."""
        return 1 if self.itl_during_prefill_ratio is not None else self.block_size

    def tracking_host(self, log: Sequence[StepSample]) -> SloChunkPolicy:
        """This policy with ``host_factor`` = the median measured / predicted time of the last
        ``HOST_FACTOR_WINDOW`` mixed steps (prefill and decode) of ``log`` (oldest first); itself
        while ``log`` holds fewer than ``HOST_FACTOR_MIN_STEPS`` of them or the factor moved by
        5 % or less."""
        mixed = (s for s in reversed(log) if s.prefill_tokens and s.decode_batch and s.predicted_s > 0)
        recent = list(itertools.islice(mixed, HOST_FACTOR_WINDOW))
        if len(recent) < HOST_FACTOR_MIN_STEPS:
            return self
        factor = statistics.median(s.measured_s / s.predicted_s for s in recent)
        if abs(factor / self.host_factor - 1.0) <= 0.05:
            return self
        return dataclasses.replace(self, host_factor=factor)

    def describe(self, max_batch_size: int, context_per_seq: int = 256) -> str:
        """One line for reports: the chunk chosen per decode batch size (requests on track, no
        slack spent), and the costs behind it."""
        c = self.cost
        batches = sorted({b for b in (1, 2, 4, 8, max_batch_size) if b <= max_batch_size})
        chunks = ", ".join(f"{b} -> {self.max_prefill_tokens(b, b * context_per_seq)}" for b in batches)
        cap = ""
        if self.itl_budget_ms is not None:
            cap = f"; ITL budget {self.itl_budget_ms:g} ms: steps up to {self.step_cap_s * 1e3:.0f} ms "
            if self.step_cap_s * 1e3 < self.tpot_budget_ms:  # the ITL budget is the tighter limit
                cap += f"({ITL_BUDGET_MARGIN:g}x it, below the TPOT budget: the ITL budget sets the chunk size)"
            else:
                cap += "while every decoding request's TPOT stays within budget"
        if self.itl_during_prefill_ratio is not None:
            cap += f"; steps beside decodes up to {self.itl_during_prefill_ratio:g}x the decode-only step"
            cap += self._ratio_unmet(batches, context_per_seq)
        floor = "one token" if self.min_chunk_tokens == 1 else f"one block = {self.block_size}"
        return (
            f"slo: TPOT budget {self.tpot_budget_ms:g} ms{cap}; measured step cost: prefill "
            f"{c.prefill_s[0] * 1e3:.1f} ms + {c.prefill_s[1] * 1e3:.3f} ms/token, decode "
            f"{c.decode_s[0] * 1e3:.1f} ms + {c.decode_s[1] * 1e3:.2f} ms/sequence"
            f"{', one call per mixed step' if c.fused else ''}{_fused_terms(c)}"
            f"{f', host now {self.host_factor:.2f}x slower than then' if self.host_factor != 1.0 else ''} (model error "
            f"{c.error_ms:.1f} ms, {c.rel_error:.0%}); prefill chunk by decode batch at "
            f"{context_per_seq} tokens of context: {chunks} tokens (never below {floor}); no decode running: {self.max_num_tokens} tokens"
        )


NO_BUDGET = "slo policy without a TPOT budget"  # fcfs_description's ``why`` when slo has no budget


def choose_chunk_policy(
    scheduler_policy: str,
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    itl_during_prefill_ratio: float | None,
    *,
    cost: Callable[[], StepCostModel],
    block_size: int,
    max_num_tokens: int,
    max_batch_size: int,
) -> tuple[SloChunkPolicy | None, str]:
    """The scheduler's chunk policy for ``scheduler_policy`` (``slo`` / ``fcfs``) and the budgets
    (see :meth:`~trtpipe.runtime.llm.LLM.set_tpot_budget`), and one line saying which prefill chunk
    sizes that gives and why. None = FCFS (policy fcfs, or slo with neither a TPOT nor an ITL
    budget). ``cost`` is called (the step-cost model measured) only for an slo policy. Raises
    :class:`TrtpipeError` for a budget that is not a finite number of ms > 0 or a ratio <= 1,
    before ``cost`` is called."""
    for name, value in (("tpot_budget_ms", tpot_budget_ms), ("itl_budget_ms", itl_budget_ms)):
        if value is not None:
            check_budget_ms(name, value)
    if itl_during_prefill_ratio is not None:
        check_itl_ratio(itl_during_prefill_ratio)
    tpot_budget_ms = itl_budget_ms if tpot_budget_ms is None else tpot_budget_ms  # TPOT <= every ITL
    if scheduler_policy == "fcfs" or tpot_budget_ms is None:
        why = "policy fcfs" if scheduler_policy == "fcfs" else NO_BUDGET
        return None, fcfs_description(why, max_num_tokens, itl_budget_ms, itl_during_prefill_ratio)
    policy = SloChunkPolicy(
        cost(), float(tpot_budget_ms), block_size, max_num_tokens, itl_budget_ms,
        itl_during_prefill_ratio=itl_during_prefill_ratio,
    )  # fmt: skip
    return policy, policy.describe(max_batch_size, 256)


def check_itl_ratio(value: object) -> None:
    """Raise :class:`TrtpipeError` unless ``value`` is a finite number > 1 (an int or float, not
    a bool): the ITL-during-prefill ratio of :class:`SloChunkPolicy`."""
    number = _finite_number(value)
    if number is None or number <= 1:
        raise TrtpipeError(
            f"itl_during_prefill_ratio = {value!r}: expected a finite number > 1 (the longest step beside "
            "decodes over the decode-only step); fix: e.g. 1.5 (recipe runtime.scheduler.itl_during_prefill_ratio: "
            "1.5, serve --itl-during-prefill-ratio 1.5), or None for the TPOT/ITL budgets alone"
        )


def _fused_terms(c: StepCostModel) -> str:
    """The fused mixed-step coefficients for :meth:`SloChunkPolicy.describe` ('' without them)."""
    if c.fused_s is None:
        return ""
    f0, f1, f2 = (x * 1e3 for x in c.fused_s)
    return f" ({f0:.1f} ms + {f1:.3f} ms/token + {f2:.1f} ms/decode row)"


def fcfs_description(
    why: str, max_num_tokens: int, itl_budget_ms: float | None = None, itl_during_prefill_ratio: float | None = None
) -> str:
    """The reports' line for FCFS chunks (``why``: which policy or missing budget chose them); an
    ITL budget or ITL-during-prefill ratio given anyway is named as not used, never dropped silently."""
    given = []
    if itl_budget_ms is not None:
        given.append(f"the ITL budget {itl_budget_ms:g} ms")
    if itl_during_prefill_ratio is not None:
        given.append(f"the ITL-during-prefill ratio {itl_during_prefill_ratio:g}")
    unused = ""
    if given:
        verb, them = ("are", "them") if len(given) > 1 else ("is", "it")
        fix = (
            "give a TPOT budget: runtime.scheduler.tpot_budget_ms / --tpot-budget-ms"
            if why == NO_BUDGET
            else "runtime.scheduler.policy: slo / --scheduler-policy slo"
        )
        unused = (
            f"; {' and '.join(given)} {verb} not used: only the slo policy with a TPOT budget applies {them} ({fix})"
        )
    return f"fcfs ({why}): prefill chunks of up to max_num_tokens = {max_num_tokens} tokens per step{unused}"


__all__ = [
    "HOST_FACTOR_MIN_STEPS",
    "HOST_FACTOR_WINDOW",
    "ITL_BUDGET_MARGIN",
    "SloChunkPolicy",
    "check_budget_ms",
    "check_itl_ratio",
    "choose_chunk_policy",
    "fcfs_description",
]
