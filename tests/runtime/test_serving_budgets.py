"""The budgets a server derives, the chunk sizes the slo policy picks under them, the queue wait
admission predicts, and the engine-probe gates: all against figures computed by hand from a
step-cost model written out here (the coefficients of the issue-27 Intel measurement)."""

from __future__ import annotations

import pytest

from trtpipe.runtime.measure.budgets import Budget, evaluate_probe_budgets
from trtpipe.runtime.measure.engine_probes import ProbeResult, split_gaps
from trtpipe.runtime.sched.queue_wait import LoadSnapshot, expected_remaining, predicted_wait_s
from trtpipe.runtime.sched.serving_budgets import derive_serving_budgets, serving_budgets
from trtpipe.runtime.sched.slo_policy import SloChunkPolicy
from trtpipe.runtime.sched.step_cost import StepCostModel

# prefill 5.2 ms + 1.29 ms/token; decode 6.4 ms + 1.09 ms/sequence + 8.0e-6 s/context token;
# fused mixed step 5.8 ms + 1.30 ms/token + 1.6 ms/decode row (+ the decode context term)
COST = StepCostModel(
    prefill_s=(0.0052, 0.00129, 0.0), decode_s=(0.0064, 0.00109, 8.0e-6), fused=True, fused_s=(0.0058, 0.0013, 0.0016)
)


def test_derived_budgets_keep_the_interactive_slo_or_raise_it_just_enough():
    # the smallest full-batch mixed step: fused 5.8 + 1.3 x 16 + 1.6 x 8 + 0.008 x 8 x 512 = 72.168 ms
    # <= 0.8 x 100 ms: the engine holds TPOT 50 / ITL 100
    b = derive_serving_budgets(COST, max_batch_size=8, max_seq_len=2048, block_size=16)
    assert (b.tpot_budget_ms, b.itl_budget_ms, b.source) == (50.0, 100.0, "derived")
    assert "the interactive SLO" in b.why and "72.2 ms" in b.why
    # a slower attention (d2 = 2e-5 s per context token): 5.8 + 20.8 + 12.8 + 81.92 = 121.32 ms;
    # TPOT = 121.32 / (0.8 x 2) = 75.825 -> 75.8, ITL 151.6: that step just fits 0.8 x ITL
    slow = StepCostModel(COST.prefill_s, (0.0064, 0.00109, 2.0e-5), fused=True, fused_s=COST.fused_s)
    r = derive_serving_budgets(slow, 8, 2048, 16)
    assert (r.tpot_budget_ms, r.itl_budget_ms) == (75.8, 151.6) and "raised from 50 ms" in r.why
    # max_seq_len 512: 256 tokens of context; given budgets win; an ITL budget alone is also the TPOT budget
    assert derive_serving_budgets(slow, 8, 512, 16).tpot_budget_ms == 50.2  # (5.8+20.8+12.8+40.96) / 1.6 = 50.225
    assert serving_budgets(None, 80.0, COST, 8, 2048, 16).tpot_budget_ms == 80.0
    assert serving_budgets(40.0, None, COST, 8, 2048, 16).itl_budget_ms is None


def test_chunk_sizes_under_budgets_computed_by_hand():
    # TPOT 50 ms, no ITL budget: 5.8 + 1.3 n + 1.6 b + 0.008 x context <= 50
    p = SloChunkPolicy(COST, 50.0, block_size=16, max_num_tokens=512)
    assert p.max_prefill_tokens(1, 256) == 31  # 9.448 + 1.3 n <= 50 -> n <= 31.19
    assert p.max_prefill_tokens(8, 2048) == 16  # 34.984 + 1.3 n <= 50 -> 11, raised to one block
    assert p.max_prefill_tokens(0, 0) == 512  # nobody decodes: whole prompts
    # with the ITL budget 100 ms, steps up to 0.8 x 100 = 80 ms while TPOT holds: 9.448 + 1.3 n <= 80
    b = derive_serving_budgets(COST, 8, 2048, 16)
    q = SloChunkPolicy(COST, b.tpot_budget_ms, 16, 512, b.itl_budget_ms)
    assert q.max_prefill_tokens(1, 256) == 54  # n <= 54.27


def test_predicted_queue_wait_by_hand():
    p = SloChunkPolicy(COST, 50.0, block_size=16, max_num_tokens=512)
    load = LoadSnapshot(
        prefill_tokens=300, num_waiting=2, num_decoding=2, decode_context_sum=200, remaining_decode_tokens=(10, 50)
    )
    # chunk beside 2 decodes: 10.6 + 1.3 n <= 50 -> 30; step 5.8 + 39 + 3.2 + 1.6 = 49.6 ms; 10 steps
    assert predicted_wait_s(load, COST, p, max_num_tokens=512, max_batch_size=8) == pytest.approx(0.496)
    # a batch of 3 is full (2 running + 2 waiting): row 1 frees after 50 decode steps of
    # 6.4 + 2.18 + 1.6 = 10.18 ms = 509 ms, later than the prefill ahead
    assert predicted_wait_s(load, COST, p, max_num_tokens=512, max_batch_size=3) == pytest.approx(0.509)
    # channel requests add work; FCFS chunks of 512: one 512-token step with 2 decodes = 675.6 ms
    fcfs = predicted_wait_s(load, COST, None, max_num_tokens=512, max_batch_size=8, extra_prefill_tokens=100)
    assert fcfs == pytest.approx(0.0058 + 0.0013 * 512 + 0.0032 + 0.0016)
    idle = LoadSnapshot(0, 0, 0, 0, ())
    assert predicted_wait_s(idle, COST, p, max_num_tokens=512, max_batch_size=8) == 0.0


def test_probe_gates_split_gaps_and_fail_without_data():
    times = [0.0, 0.10, 0.11, 0.12, 0.13, 0.20, 0.21]  # gaps 100, 10, 10, 10, 70, 10 ms
    steady, during = split_gaps(times, [(0.125, 0.19)])  # the first two gaps are left out
    assert [round(g) for g in steady] == [10, 10] and [round(g) for g in during] == [10, 70]
    probe = ProbeResult(
        cancel_ms=(100.0, 200.0, 300.0),
        itl_steady_ms=(10.0, 10.0),
        itl_during_prefill_ms=(10.0, 70.0),
        partner_ttft_ms=(900.0, 1300.0, 1000.0),
    )
    rows = evaluate_probe_budgets(
        probe, [Budget("cancel_ms", "p95", "max", 500.0), Budget("itl_during_prefill_ratio", "p95", "max", 1.5)]
    )
    assert rows[0].passed and rows[0].measured == pytest.approx(290.0)  # 200 + 0.9 x 100
    assert not rows[1].passed and rows[1].measured == pytest.approx(67.0 / 10.0) and rows[1].unit == "x"
    assert rows[1].reason == "6.7 x violates <= 1.5; the partners' TTFT p50 1000 ms"
    [empty] = evaluate_probe_budgets(ProbeResult(), [Budget("cancel_ms", "p95", "max", 500.0)])
    assert not empty.passed and empty.reason.startswith("no data")


def test_expected_remaining_tokens():
    from types import SimpleNamespace as NS

    def req(max_new: int, done: int, ignore_eos: bool):
        return NS(sampling_params=NS(max_new_tokens=max_new, ignore_eos=ignore_eos), output_token_ids=[0] * done)

    assert expected_remaining(req(1000, 10, True), 40) == 990  # ignores EOS: exactly what is left
    assert expected_remaining(req(1000, 10, False), 40) == 30  # may stop: where recent ones stopped
    assert expected_remaining(req(1000, 50, False), 40) == 1  # past the median: one more at least
    assert expected_remaining(req(20, 10, False), 40) == 10  # capped by max_new_tokens
    assert expected_remaining(req(1000, 10, False), None) == 0  # no history: not counted
