"""StepCostError: planned-vs-measured step times of the slo policy's log, against hand-computed figures."""

from __future__ import annotations

import pytest

from trtpipe.runtime.measure.step_cost_error import StepCostError
from trtpipe.runtime.sched.step_cost import StepSample

# (predicted_s, measured_s, prefill_tokens, decode_batch, host_factor)
SAMPLES = [
    StepSample(0.040, 0.050, 64, 2, 1.0),  # mixed: planned 40 ms, ran 50: error 0.2, over a 45 ms ITL budget
    StepSample(0.020, 0.040, 32, 1, 1.5),  # mixed: planned 30 ms, ran 40: error 0.25
    StepSample(0.020, 0.020, 0, 3, 1.0),  # decode-only: exact
    StepSample(0.030, 0.060, 0, 3, 1.0),  # decode-only: error 0.5, over the budget
    StepSample(0.100, 0.080, 128, 0, 1.0),  # prefill-only: error 0.25, over the budget
    StepSample(0.010, 0.0, 0, 1, 1.0),  # no measured time: skipped
]


def test_errors_are_of_the_planned_time_and_mixed_steps_are_counted_apart():
    e = StepCostError.of(SAMPLES, itl_budget_ms=45.0)
    assert (e.num_steps, e.num_mixed_steps) == (5, 2)
    # all steps: errors 0.2, 0.25, 0.0, 0.5, 0.25 -> sorted 0, 0.2, 0.25, 0.25, 0.5
    assert e.rel_error_p50 == pytest.approx(0.25)
    assert e.rel_error_p90 == pytest.approx(0.25 + 0.6 * (0.5 - 0.25))  # rank 3.6: linear
    assert e.mixed_rel_error_p50 == pytest.approx(0.225)
    assert e.mixed_rel_error_p90 == pytest.approx(0.245)
    assert (e.mixed_over_itl_budget, e.decode_only_over_itl_budget) == (1, 1)  # prefill-only: no token gap
    assert e.line() == (
        "slo steps: 5, 2 mixed (prefill beside decodes); step-cost model x host factor vs measured step "
        "time: off by p50 25 %, p90 40 % (mixed steps: p50 22 %, p90 24 %); over the ITL budget: 1 mixed, "
        "1 decode-only steps"
    )


def test_without_an_itl_budget_or_steps():
    e = StepCostError.of(SAMPLES[2:4])
    assert (e.num_mixed_steps, e.mixed_rel_error_p50, e.mixed_over_itl_budget) == (0, None, None)
    assert e.line() == (
        "slo steps: 2, none mixed; step-cost model x host factor vs measured step time: off by p50 25 %, p90 45 %"
    )
    assert StepCostError.of([]).line() == "slo steps: none logged"
    assert StepCostError.of([]).to_dict()["num_steps"] == 0
