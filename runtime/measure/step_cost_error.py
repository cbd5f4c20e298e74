"""How well the step-cost model planned the steps of a run: the ``slo`` policy's log, summarized.

Each logged step (:class:`~trtpipe.runtime.sched.step_cost.StepSample`, recorded by
:class:`~trtpipe.runtime.llm.LLM` under the ``slo`` policy) carries the model's prediction, the
host factor the policy planned with and the wall time. The planned time is ``predicted_s x
host_factor``; its relative error is ``|planned - measured| / measured``. Mixed steps (prefill
tokens and decodes together) are the ones the policy sizes, so they are counted apart; a step
that ran longer than the ITL budget is a token gap over it for every request it decoded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from trtpipe.runtime.metrics.percentiles import percentile
from trtpipe.runtime.sched.step_cost import StepSample


@dataclass(frozen=True)
class StepCostError:
    """Planned-vs-measured step times of one run. Errors are fractions (0.2 = 20 %), None
    without steps of that kind; ``*_over_itl_budget`` are None without an ITL budget."""

    num_steps: int
    num_mixed_steps: int
    rel_error_p50: float | None  # all steps
    rel_error_p90: float | None
    mixed_rel_error_p50: float | None  # steps with prefill tokens and decodes
    mixed_rel_error_p90: float | None
    mixed_over_itl_budget: int | None  # mixed steps whose wall time exceeded the ITL budget
    decode_only_over_itl_budget: int | None  # steps without prefill tokens over it

    @classmethod
    def of(cls, samples: Iterable[StepSample], itl_budget_ms: float | None = None) -> StepCostError:
        """Summarize ``samples`` (steps with a measured time > 0; the others are skipped)."""
        steps = [s for s in samples if s.measured_s > 0]
        mixed = [s for s in steps if s.prefill_tokens and s.decode_batch]

        def errors(of: list[StepSample]) -> list[float]:
            return [abs(s.predicted_s * s.host_factor - s.measured_s) / s.measured_s for s in of]

        def pct(values: list[float], q: float) -> float | None:
            return round(percentile(values, q), 4) if values else None

        def over(of: Iterable[StepSample]) -> int | None:
            return None if itl_budget_ms is None else sum(s.measured_s * 1e3 > itl_budget_ms for s in of)

        every, mixed_err = errors(steps), errors(mixed)
        return cls(
            num_steps=len(steps),
            num_mixed_steps=len(mixed),
            rel_error_p50=pct(every, 50),
            rel_error_p90=pct(every, 90),
            mixed_rel_error_p50=pct(mixed_err, 50),
            mixed_rel_error_p90=pct(mixed_err, 90),
            mixed_over_itl_budget=over(mixed),
            decode_only_over_itl_budget=over(s for s in steps if not s.prefill_tokens),
        )

    def line(self) -> str:
        """One line for a console: ``slo steps: 412, 96 mixed (prefill beside decodes); step-cost
        model x host factor vs measured step time: off by p50 12 %, p90 31 % (mixed steps: p50 18 %,
        p90 40 %); over the ITL budget: 3 mixed, 0 decode-only steps``."""
        if not self.num_steps:
            return "slo steps: none logged"

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.0f} %"

        mixed = f"{self.num_mixed_steps} mixed (prefill beside decodes)" if self.num_mixed_steps else "none mixed"
        text = (
            f"slo steps: {self.num_steps}, {mixed}; step-cost model x host factor vs measured step time: "
            f"off by p50 {pct(self.rel_error_p50)}, p90 {pct(self.rel_error_p90)}"
        )
        if self.num_mixed_steps:
            text += f" (mixed steps: p50 {pct(self.mixed_rel_error_p50)}, p90 {pct(self.mixed_rel_error_p90)})"
        if self.mixed_over_itl_budget is not None:
            text += (
                f"; over the ITL budget: {self.mixed_over_itl_budget} mixed, "
                f"{self.decode_only_over_itl_budget} decode-only steps"
            )
        return text

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = ["StepCostError"]
