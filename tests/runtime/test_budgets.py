"""Budget evaluation and the gate exit code, with hand-computed margins."""

from types import SimpleNamespace

import pytest

from trtpipe.runtime.measure.budgets import BudgetError, BudgetResult, evaluate_budgets, gate_exit_code, parse_budget
from trtpipe.runtime.metrics.request_metrics import RequestTimer, summarize


def _req(request_id, arrival, token_times):
    t = RequestTimer(request_id, prompt_tokens=8, arrival_s=arrival)
    for x in token_times:
        t.on_tokens(x, 1)
    return t.metrics()


@pytest.fixture(scope="module")
def summary():
    # TTFT [0.5, 0.3, 0.2] -> p50 300 ms, p95 480 ms; TPOT [0.2, 0.4] -> p50 300 ms;
    # ITL [0.1, 0.2, 0.3, 0.4] -> p99 397 ms; 7 tokens / 2 s = 3.5 tokens/s
    reqs = [_req("a", 0.0, [0.5, 0.6, 0.8, 1.1]), _req("b", 0.0, [0.3]), _req("c", 1.0, [1.2, 1.6])]
    return summarize(reqs, wall_s=2.0)


def test_max_budget_pass_and_margin(summary):
    [r] = evaluate_budgets(summary, [{"metric": "ttft_ms", "percentile": "p95", "max": 500.0}])
    assert r.passed
    assert r.measured == pytest.approx(480.0)
    assert r.margin == pytest.approx((500 - 480) / 500)  # 0.04
    assert (r.metric, r.percentile, r.kind, r.limit) == ("ttft_ms", "p95", "max", 500.0)


def test_max_budget_fail_negative_margin(summary):
    [r] = evaluate_budgets(summary, [{"metric": "ttft_ms", "percentile": "p50", "max": 250.0}])
    assert not r.passed
    assert r.measured == pytest.approx(300.0)
    assert r.margin == pytest.approx(-0.2)


def test_tpot_and_itl_budgets(summary):
    results = evaluate_budgets(
        summary,
        [
            {"metric": "tpot_ms", "percentile": "p50", "max": 350.0},
            {"metric": "itl_ms", "percentile": "p99", "max": 390.0},
            {"metric": "e2e_ms", "percentile": "p90", "max": 2000.0},
        ],
    )
    assert [r.passed for r in results] == [True, False, True]
    assert results[0].measured == pytest.approx(300.0)
    assert results[0].margin == pytest.approx(50.0 / 350.0)
    assert results[1].measured == pytest.approx(397.0)  # 300 + 0.97 * 100
    assert results[2].measured == pytest.approx(1000.0)  # E2E [0.3, 0.6, 1.1]: h=1.8 -> 1.0 s


def test_min_throughput_budget(summary):
    ok, bad = evaluate_budgets(
        summary, [{"metric": "output_tokens_per_s", "min": 3.0}, {"metric": "output_tokens_per_s", "min": 4.0}]
    )
    assert ok.passed and ok.margin == pytest.approx((3.5 - 3.0) / 3.0)
    assert not bad.passed and bad.margin == pytest.approx(-0.125)
    assert ok.unit == "tokens/s" and ok.percentile is None


def test_budget_on_metric_without_data_fails_with_reason():
    s = summarize([_req("a", 0.0, [0.1]), _req("b", 0.0, [0.2])], wall_s=1.0)
    [r] = evaluate_budgets(s, [{"metric": "tpot_ms", "percentile": "p95", "max": 100.0}])
    assert not r.passed
    assert r.measured is None and r.margin is None
    assert "no data" in r.reason and "2 or more output tokens" in r.reason
    [t] = evaluate_budgets(summarize([], wall_s=0.0), [{"metric": "output_tokens_per_s", "min": 1}])
    assert not t.passed and "no data" in t.reason


def test_object_specs_and_percentile_spellings(summary):
    specs = [
        SimpleNamespace(metric="ttft_ms", percentile=95, max=500.0, min=None),
        SimpleNamespace(metric="ttft_ms", percentile="P95", max=500.0),  # no min attribute
        {"metric": "ttft_ms", "percentile": "95", "max": 500},
    ]
    results = evaluate_budgets(summary, specs)
    assert [r.percentile for r in results] == ["p95"] * 3
    assert all(r.passed for r in results)


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"metric": "latency", "percentile": "p95", "max": 1.0}, "metric='latency'"),
        ({"metric": "ttft_ms", "max": 1.0}, "percentile=None"),
        ({"metric": "ttft_ms", "percentile": "p75", "max": 1.0}, "percentile='p75'"),
        ({"metric": "ttft_ms", "percentile": "p95"}, "exactly one of max / min"),
        ({"metric": "ttft_ms", "percentile": "p95", "max": 1, "min": 1}, "exactly one"),
        ({"metric": "ttft_ms", "percentile": "p95", "min": 1.0}, "takes max"),
        ({"metric": "output_tokens_per_s", "max": 1.0}, "takes min"),
        ({"metric": "output_tokens_per_s", "percentile": "p50", "min": 1.0}, "remove it"),
        ({"metric": "ttft_ms", "percentile": "p95", "max": -5}, "expected a finite number > 0"),
        ({"metric": "ttft_ms", "percentile": "p95", "max": "fast"}, "not a number"),
    ],
)
def test_malformed_budget_raises(spec, match):
    with pytest.raises(BudgetError, match=match):
        parse_budget(spec)


def test_gate_exit_code():
    ok = BudgetResult("ttft_ms", "p95", "max", 500.0, 480.0, 0.04, True)
    bad = BudgetResult("ttft_ms", "p50", "max", 250.0, 300.0, -0.2, False)
    assert gate_exit_code([ok], correctness_ok=True) == 0
    assert gate_exit_code([], correctness_ok=True) == 0
    assert gate_exit_code([ok, bad], correctness_ok=True) == 1
    assert gate_exit_code([ok], correctness_ok=False) == 1
    assert gate_exit_code([ok], correctness_ok=True, kv_leak_free=False) == 1
    assert gate_exit_code([ok], correctness_ok=True, kv_leak_free=True) == 0


def test_gate_record():
    """Gate.of: the exit code of gate_exit_code; an unchecked correctness (None) or leak check does
    not fail it; to_dict is report.json's gate object."""
    from trtpipe.runtime.measure.budgets import Gate

    ok = BudgetResult("ttft_ms", "p95", "max", 500.0, 480.0, 0.04, True)
    bad = BudgetResult("ttft_ms", "p50", "max", 250.0, 300.0, -0.2, False)
    g = Gate.of([ok], None, None)
    assert (g.passed, g.exit_code, g.budgets_passed) == (True, 0, True)
    assert g.to_dict() == {
        "passed": True,
        "exit_code": 0,
        "budgets_passed": True,
        "correctness_passed": None,
        "kv_leak_free": None,
    }
    assert Gate.of([ok, bad], True, True).exit_code == 1 and not Gate.of([ok, bad], True, True).budgets_passed
    assert Gate.of([ok], False, True).exit_code == 1
    assert Gate.of([ok], True, False).exit_code == 1


def test_budget_result_dict_round_trip():
    r = BudgetResult("tpot_ms", "p95", "max", 100.0, None, None, False, "no data: x")
    d = r.to_dict()
    assert d["unit"] == "ms"
    assert BudgetResult.from_dict(d) == r
