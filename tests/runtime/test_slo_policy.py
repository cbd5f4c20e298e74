"""SLO-aware chunked prefill: the step-cost model's fit, chunk sizes computed by hand on a
synthetic cost model, and the scheduler applying them (no model)."""

import dataclasses

import numpy as np
import pytest

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.request import Request
from trtpipe.runtime.sched.scheduler import Scheduler
from trtpipe.runtime.sched.slo_policy import (
    HOST_FACTOR_MIN_STEPS,
    HOST_FACTOR_WINDOW,
    SloChunkPolicy,
    check_budget_ms,
    check_itl_ratio,
)
from trtpipe.runtime.sched.step import DecodeProgress
from trtpipe.runtime.sched.step_cost import StepCostModel, StepSample, fit, fit_fused, with_error

# prefill 2 ms + 1 ms/token; decode 5 ms + 1 ms/sequence (no attention terms)
COST = StepCostModel(prefill_s=(0.002, 0.001, 0.0), decode_s=(0.005, 0.001, 0.0), error_ms=1.5)


def test_fit_recovers_known_coefficients_and_states_held_out_error():
    truth = StepCostModel(prefill_s=(0.003, 0.0012, 2e-7), decode_s=(0.006, 0.0008, 1e-6))
    pre = [(n, c, truth.prefill_time_s(n, c)) for n, c in ((16, 0), (64, 0), (256, 0), (64, 256), (128, 512))]
    dec = [(b, b * c, truth.decode_time_s(b, b * c)) for b, c in ((1, 32), (4, 32), (8, 256), (2, 512))]
    got = fit(pre, dec)
    for a, b in zip(got.prefill_s + got.decode_s, truth.prefill_s + truth.decode_s):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12)
    # held-out calls 1 ms slower than predicted: error_ms = 1.0, rel = 1 / (measured ms)
    held = with_error(got, [(96, 0, truth.prefill_time_s(96, 0) + 0.001)], [(3, 300, truth.decode_time_s(3, 300))])
    assert held.error_ms == pytest.approx(1.0)
    assert held.rel_error == pytest.approx(0.001 / (truth.prefill_time_s(96, 0) + 0.001))
    assert StepCostModel.from_json(held.to_json()) == held


def test_chunk_sizes_by_hand():
    p = SloChunkPolicy(COST, tpot_budget_ms=50, block_size=16, max_num_tokens=512)
    # 2 decodes: 5 + 2 = 7 ms; 43 ms left; 2 + n <= 43 -> n <= 41 (any token count, not blocks)
    assert p.max_prefill_tokens(2, 200) == 41
    # 8 decodes: 13 ms; 37 left; n <= 35
    assert p.max_prefill_tokens(8, 800) == 35
    # 30 decodes: 35 ms; 15 left; n <= 13 -> 0 blocks -> never below one block: 16
    assert p.max_prefill_tokens(30, 3000) == 16
    # no decode running: nobody's ITL is at stake -> max_num_tokens
    assert p.max_prefill_tokens(0, 0) == 512
    # 100 ms budget, 1 decode: 6 ms; 94 left; n <= 92
    assert SloChunkPolicy(COST, 100, 16, 512).max_prefill_tokens(1, 10) == 92
    # the step budget also carries the decodes: max_num_tokens 40, 2 decodes -> room 38
    assert SloChunkPolicy(COST, 1000, 16, 40).max_prefill_tokens(2, 10) == 38
    # the attention term: p2 = 1e-5 s per token*key, context 1000: 16 tokens cost
    # 2 + 16 + 0.01 * 16 * 1008 = 179.28 ms > budget -> one block
    att = StepCostModel(prefill_s=(0.002, 0.001, 1e-5), decode_s=COST.decode_s)
    assert SloChunkPolicy(att, 50, 16, 512).max_prefill_tokens(2, 200, prefill_context=1000) == 16
    assert "TPOT budget 50 ms" in p.describe(8) and "2 -> 41" in p.describe(8)
    with pytest.raises(TrtpipeError, match="tpot_budget_ms = 0"):
        SloChunkPolicy(COST, 0, 16, 512)
    with pytest.raises(TrtpipeError, match="itl_budget_ms = -5"):
        SloChunkPolicy(COST, 50, 16, 512, itl_budget_ms=-5)


def test_itl_budget_lets_requests_spend_tpot_slack_by_hand():
    """TPOT 50 ms, ITL 101 ms: steps up to 0.8 x 101 = 80.8 ms while every decoding request's TPOT
    (its gaps so far plus this step plus decode-only steps for the rest) ends <= 50 ms."""
    p = SloChunkPolicy(COST, tpot_budget_ms=50, block_size=16, max_num_tokens=512, itl_budget_ms=101)
    assert p.step_cap_s == pytest.approx(0.0808)
    fresh = DecodeProgress(num_itl=0, itl_sum_s=0.0, remaining_tokens=48)
    # 1 decode (6 ms): slack = 0.05 * 48 - 0 - 47 * 0.006 = 2.118 s > cap -> 2 + n + 6 <= 80.8 -> 72
    assert p.max_prefill_tokens(1, 10, 0, (fresh,)) == 72
    # without an ITL budget the same request gets the TPOT budget: 2 + n + 6 <= 50 -> 42
    assert SloChunkPolicy(COST, 50, 16, 512).max_prefill_tokens(1, 10, 0, (fresh,)) == 42
    # its last token, 9 gaps took 0.4405 s: slack = 0.05 * 10 - 0.4405 = 59.5 ms -> n <= 51.5 -> 51
    tight = DecodeProgress(num_itl=9, itl_sum_s=0.4405, remaining_tokens=1)
    assert p.max_prefill_tokens(1, 10, 0, (tight,)) == 51
    # the tightest request decides: fresh and tight, 2 decodes (7 ms): 2 + n + 7 <= 59.5 -> 50
    assert p.max_prefill_tokens(2, 20, 0, (fresh, tight)) == 50
    # behind budget (10 gaps in 0.6 s, 2 to come): slack 0.6 - 0.6 - 0.006 < 0 -> one block, with
    # or without an ITL budget
    behind = DecodeProgress(num_itl=10, itl_sum_s=0.6, remaining_tokens=2)
    assert p.max_prefill_tokens(1, 10, 0, (behind,)) == 16
    assert SloChunkPolicy(COST, 50, 16, 512).max_prefill_tokens(1, 10, 0, (behind,)) == 16
    assert "ITL budget 101 ms: steps up to 81 ms" in p.describe(8)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tpot_budget_ms", 0),
        ("tpot_budget_ms", "50"),
        ("tpot_budget_ms", float("inf")),
        ("itl_budget_ms", 0),
        ("itl_budget_ms", -5),
        ("itl_budget_ms", "100"),
        ("itl_budget_ms", True),
        ("itl_budget_ms", float("nan")),
        ("itl_budget_ms", float("inf")),
    ],
)
def test_bad_budget_names_field_value_expectation_and_fix(field, value):
    """A string, a bool (True would be 1 ms), NaN and infinity are refused like <= 0, with the
    fix for that budget (not the other one's)."""
    budgets = {"tpot_budget_ms": 50, "itl_budget_ms": None, field: value}
    with pytest.raises(TrtpipeError) as e:
        SloChunkPolicy(COST, budgets["tpot_budget_ms"], 16, 512, itl_budget_ms=budgets["itl_budget_ms"])
    msg = str(e.value)
    assert msg.startswith(f"{field} = {value!r}: expected a finite number of ms > 0; fix: ")
    flag, other = (
        ("--itl-budget-ms", "--tpot-budget-ms") if field == "itl_budget_ms" else ("--tpot-budget-ms", "--itl-budget-ms")
    )
    assert flag in msg and other not in msg
    check_budget_ms(field, np.float64(50.0))  # NumPy scalars are numbers
    check_budget_ms(field, np.int64(50))


def test_describe_says_when_the_itl_budget_is_the_tighter_limit():
    """ITL 101 ms under a TPOT budget of 200 ms: steps up to 80.8 ms, which is below the TPOT budget,
    so the ITL budget shrinks the chunks (200 ms alone: 2 + n + 7 <= 200 -> 191; 80.8 ms: 71)."""
    p = SloChunkPolicy(COST, 200, 16, 512, itl_budget_ms=101)
    assert p.max_prefill_tokens(2, 200) == 71
    assert SloChunkPolicy(COST, 200, 16, 512).max_prefill_tokens(2, 200) == 191
    assert (
        "ITL budget 101 ms: steps up to 81 ms (0.8x it, below the TPOT budget: the ITL budget sets the chunk size)"
        in p.describe(8)
    )
    loose = SloChunkPolicy(COST, 50, 16, 512, itl_budget_ms=100).describe(8)
    assert "steps up to 80 ms while every decoding request's TPOT stays within budget" in loose


def test_host_factor_scales_every_prediction_by_hand():
    """The host now runs 1.5x slower than the calibration: plan with 1.5 x the model's times."""
    slow = SloChunkPolicy(COST, 50, 16, 512, host_factor=1.5)
    # 2 decodes: 1.5 * (2 + n + 7) <= 50 -> n <= 24.33 -> 24 (at factor 1: 41)
    assert slow.max_prefill_tokens(2, 200) == 24
    # the slack's decode-only steps too: 1 decode (6 ms -> 9 ms), last 2 tokens after 10 gaps in
    # 0.45 s: slack = 0.05 * 12 - 0.45 - 1 * 0.009 = 141 ms > cap 50 ms -> 1.5 * (2 + n + 6) <= 50 -> 25
    p = DecodeProgress(num_itl=10, itl_sum_s=0.45, remaining_tokens=2)
    assert slow.max_prefill_tokens(1, 10, 0, (p,)) == 25
    # ... and with an ITL budget of 101 ms (cap 80.8): limit = slack 141 -> 80.8 -> 1.5 (8 + n) <= 80.8 -> 45
    assert (
        SloChunkPolicy(COST, 50, 16, 512, itl_budget_ms=101, host_factor=1.5).max_prefill_tokens(1, 10, 0, (p,)) == 45
    )
    assert "host now 1.50x slower" in slow.describe(8)


def test_host_factor_follows_the_mixed_steps_only():
    policy = SloChunkPolicy(COST, 50, 16, 512)
    decode_only = [StepSample(0.010, 0.010, 0, 2, 1.0)] * 40  # predicted well: not what is planned
    mixed = [StepSample(0.040, 0.060, 16, 2, 1.0)] * (HOST_FACTOR_MIN_STEPS - 1)  # 1.5x slower
    assert policy.tracking_host(decode_only + mixed) is policy  # too few mixed steps yet
    tracked = policy.tracking_host(mixed + decode_only + [StepSample(0.040, 0.060, 16, 2, 1.0)])
    assert tracked.host_factor == pytest.approx(1.5)
    # the median of the last HOST_FACTOR_WINDOW mixed steps: older, faster ones drop out
    fast = [StepSample(0.040, 0.040, 16, 2, 1.0)] * HOST_FACTOR_WINDOW
    slow = [StepSample(0.040, 0.060, 16, 2, 1.0)] * (HOST_FACTOR_WINDOW // 2 + 1)  # most of the window
    assert policy.tracking_host(fast + slow).host_factor == pytest.approx(1.5)
    assert policy.tracking_host(slow + fast) is policy  # the last window is fast: factor 1.0
    # within 5 %: the same policy (no churn)
    assert tracked.tracking_host([StepSample(0.040, 0.062, 16, 2, 1.5)] * 10) is tracked


def test_scheduler_hands_each_decoding_request_its_progress():
    seen: list = []

    class Recording:
        def max_prefill_tokens(self, num_decodes, decode_context_sum, prefill_context=0, progress=(), pending=True):
            seen.append(progress)
            return 100  # both prompts fit the first step

    kv = KVCacheManager(BlockPool(100), 16)
    sched = Scheduler(kv, 512, 8, 40, chunk_policy=Recording())
    sched.add_request(Request("a", tuple(range(1, 11)), SamplingParams(max_new_tokens=5, ignore_eos=True)))
    sched.add_request(Request("b", tuple(range(1, 31)), SamplingParams(max_new_tokens=50, ignore_eos=True)))
    step = sched.schedule()
    sched.update(step, {"a": 7, "b": 7})
    sched.get_request("a").itl_sum_s = 0.0
    step = sched.schedule()
    sched.update(step, {"a": 7, "b": 7})
    sched.get_request("a").itl_sum_s = 0.125
    sched.schedule()
    # a: 2 outputs (1 gap, 0.125 s), 3 more allowed; b: 2 outputs, 48 allowed by max_new_tokens
    # but max_seq_len 40 - 32 tokens = 8
    assert seen[-1] == (
        DecodeProgress(num_itl=1, itl_sum_s=0.125, remaining_tokens=3),
        DecodeProgress(num_itl=1, itl_sum_s=0.0, remaining_tokens=8),
    )


def test_fused_step_pays_one_intercept_and_gets_bigger_chunks_by_hand():
    fused = StepCostModel(prefill_s=COST.prefill_s, decode_s=COST.decode_s, fused=True)
    # two calls: 2 + 32 (prefill) + 5 + 2 (decode 2) = 41 ms; one call: 2 + 32 + 2 = 36 ms
    assert COST.step_time_s([(32, 0)], 2, 200) * 1e3 == pytest.approx(41.0)
    assert fused.step_time_s([(32, 0)], 2, 200) * 1e3 == pytest.approx(36.0)
    # either phase alone is the same call in both models
    assert fused.step_time_s([], 2, 200) == COST.step_time_s([], 2, 200) == pytest.approx(0.007)
    assert fused.step_time_s([(32, 0)], 0, 0) == COST.step_time_s([(32, 0)], 0, 0) == pytest.approx(0.034)
    # 50 ms budget, 2 decodes: 2 + n + 2 <= 50 -> n <= 46 (two calls: 2 + n + 7 <= 50 -> 41);
    # 100 ms, 2 decodes: n <= 96 (two calls: 2 + n + 7 <= 100 -> n <= 91)
    assert SloChunkPolicy(fused, 50, 16, 512).max_prefill_tokens(2, 200) == 46
    assert SloChunkPolicy(fused, 100, 16, 512).max_prefill_tokens(2, 200) == 96
    assert SloChunkPolicy(COST, 100, 16, 512).max_prefill_tokens(2, 200) == 91
    assert "one call per mixed step" in SloChunkPolicy(fused, 50, 16, 512).describe(8)
    # held-out fused calls count in the stated error: 1 ms slower than predicted
    held = with_error(fused, [], [], [(32, 0, 2, 200, 0.037)])
    assert held.error_ms == pytest.approx(1.0) and held.fused
    assert StepCostModel.from_json(held.to_json()) == held


def test_fused_coefficients_fit_on_fused_calls_by_hand():
    """A fused call's own fit: intercept, per prompt token and per decode row (the decode call's
    per-sequence cost does not apply to a 1-token row riding in the prefill call)."""
    sep = StepCostModel(prefill_s=(0.015, 0.002, 1e-7), decode_s=(0.010, 0.006, 2e-6))
    # truth: 14 ms + 2 ms/token + 3 ms/decode row, plus the separate fits' attention terms
    truth = StepCostModel(**{**sep.__dict__, "fused": True, "fused_s": (0.014, 0.002, 0.003)})
    calls = [(8, 0, 1, 64), (16, 0, 1, 64), (32, 0, 1, 64), (16, 0, 4, 256), (48, 0, 2, 256), (32, 256, 2, 512)]
    samples = [(n, c, b, cs, truth.step_time_s([(n, c)], b, cs)) for n, c, b, cs in calls]
    got = fit_fused(sep, samples)
    assert got.fused and got.fused_s == pytest.approx((0.014, 0.002, 0.003), rel=1e-6)
    # 32 tokens at context 256 next to 2 decodes holding 512 tokens, by hand:
    # 14 + 64 + 0.1 us x 32 x (256 + 16) + 6 + 2 us x 512 = 84 + 0.8704 + 1.024 ms
    assert got.step_time_s([(32, 256)], 2, 512) * 1e3 == pytest.approx(84.0 + 0.8704 + 1.024)
    # the earlier form charged each decode row the decode call's 6 ms: 15 + 64 + 0.8704 + 12 + 1.024
    assert sep.__class__(**{**sep.__dict__, "fused": True}).step_time_s([(32, 256)], 2, 512) * 1e3 == pytest.approx(
        15 + 64 + 0.8704 + 12 + 1.024
    )
    assert StepCostModel.from_json(got.to_json()) == got
    assert "3.0 ms/decode row" in SloChunkPolicy(got, 50, 16, 512).describe(8)


def test_scheduler_caps_prefill_while_decodes_run_and_not_otherwise():
    pool = BlockPool(200)
    kv = KVCacheManager(pool, 16)
    policy = SloChunkPolicy(COST, tpot_budget_ms=50, block_size=16, max_num_tokens=512)
    sched = Scheduler(kv, 512, 8, 4096, chunk_policy=policy)
    params = SamplingParams(max_new_tokens=50, ignore_eos=True)
    sched.add_request(Request("a", tuple(range(1, 301)), params))
    step = sched.schedule()  # nobody decodes yet: the whole 300-token prompt in one chunk
    assert [p.num_tokens for p in step.prefills] == [300]
    sched.update(step, {"a": 7})
    sched.add_request(Request("b", tuple(range(1, 201)), params))
    chunks = []
    while True:
        step = sched.schedule()
        assert [d.request_id for d in step.decodes] == ["a"]
        chunks += [p.num_tokens for p in step.prefills]
        sched.update(step, {"a": 7, "b": 7})
        if not sched.get_request("b").is_prefilling:
            break
    # 1 decode: 6 ms; 44 left -> 2 + n <= 44 -> n <= 42 per step; 200 = 4 x 42 + 32
    assert chunks == [42] * 4 + [32]
    assert sched.last_prefill_cap == 42


def test_the_ratio_holds_steps_only_while_a_prompt_is_pending():
    """Two calls (COST), 1 decode: decode-only 6 ms; ratio 1.5 -> 9 ms: 2 + n + 6 <= 9 -> 1 token
    while a prompt waits or prefills. With nothing pending the cap only sizes speculative drafts,
    which keep the TPOT budget's 42 (2 + n + 6 <= 50)."""
    kv = KVCacheManager(BlockPool(200), 16)
    policy = SloChunkPolicy(COST, 50, 16, 512, itl_during_prefill_ratio=1.5)
    assert policy.max_prefill_tokens(1, 10) == 1 and policy.max_prefill_tokens(1, 10, prefill_pending=False) == 42
    sched = Scheduler(kv, 512, 8, 4096, chunk_policy=policy)
    params = SamplingParams(max_new_tokens=50, ignore_eos=True)
    sched.add_request(Request("a", tuple(range(1, 33)), params))
    sched.update(sched.schedule(), {"a": 7})  # a's prompt alone: no decode to hold
    sched.update(sched.schedule(), {"a": 7})  # a decodes, nothing pending
    assert sched.last_prefill_cap == 42
    sched.add_request(Request("b", tuple(range(1, 201)), params))
    step = sched.schedule()  # b waits: the ratio holds the step to a's pace
    assert sched.last_prefill_cap == 1 and [p.num_tokens for p in step.prefills] == [1]


def test_itl_during_prefill_ratio_holds_steps_to_a_multiple_of_the_decode_step_by_hand():
    """Fused model f0 2 ms + 1 ms/prompt token + 0.5 ms/decode row; decode call 5 ms + 1 ms/sequence.
    Ratio 1.5, 1 decode: the decode-only step is 6 ms, so the step may take 9 ms: 2 + n + 0.5 <= 9 ->
    n = 6 (a 50 ms TPOT budget alone: 2 + n + 0.5 <= 50 -> 47). Chunks go below one block."""
    fused = StepCostModel(prefill_s=COST.prefill_s, decode_s=COST.decode_s, fused=True, fused_s=(0.002, 0.001, 0.0005))
    p = SloChunkPolicy(fused, 50, 16, 512, itl_during_prefill_ratio=1.5)
    assert p.max_prefill_tokens(1, 10) == 6
    assert SloChunkPolicy(fused, 50, 16, 512).max_prefill_tokens(1, 10) == 47
    # 4 decodes: decode-only 9 ms -> 13.5 ms: 2 + n + 2 <= 13.5 -> 9
    assert p.max_prefill_tokens(4, 40) == 9
    # ratio 1.1, 1 decode: 6.6 ms: 2 + n + 0.5 <= 6.6 -> 4; ratio 1.01: 6.06 -> 3
    assert SloChunkPolicy(fused, 50, 16, 512, itl_during_prefill_ratio=1.1).max_prefill_tokens(1, 10) == 4
    assert SloChunkPolicy(fused, 50, 16, 512, itl_during_prefill_ratio=1.01).max_prefill_tokens(1, 10) == 3
    # nothing fits (two calls, 1 decode: 2 + n + 6 <= 6.06 has no n >= 0): one token, never zero
    assert SloChunkPolicy(COST, 50, 16, 512, itl_during_prefill_ratio=1.01).max_prefill_tokens(1, 10) == 1
    # the host factor scales both sides: the same chunk at 2x slower
    assert dataclasses.replace(p, host_factor=2.0).max_prefill_tokens(1, 10) == 6
    # the tighter of the ratio and the TPOT budget: 8 ms TPOT (2 + n + 0.5 <= 8 -> 5) under ratio 1.5 (6)
    assert SloChunkPolicy(fused, 8, 16, 512, itl_during_prefill_ratio=1.5).max_prefill_tokens(1, 10) == 5
    # no decode running: nobody's ITL is at stake
    assert p.max_prefill_tokens(0, 0) == 512
    line = p.describe(8)
    assert "steps beside decodes up to 1.5x the decode-only step" in line and "(never below one token)" in line
    assert "(never below one block = 16)" in SloChunkPolicy(fused, 50, 16, 512).describe(8)
    assert "unmet" not in line
    # two calls: one prompt token beside b decodes is (2 + 1) + (5 + b) ms over the 5 + b ms decode
    # step: 1.50 / 1.43 / 1.33 / 1.23x at 1 / 2 / 4 / 8; a ratio of 1.01 is unmet at every batch, 1.4
    # at 1 and 2; 1.5 at none
    unmet = "(unmet: one prompt token beside n decodes already takes, by the model, "
    assert unmet + "1 -> 1.50x, 2 -> 1.43x, 4 -> 1.33x, 8 -> 1.23x)" in SloChunkPolicy(
        COST, 50, 16, 512, itl_during_prefill_ratio=1.01
    ).describe(8)
    assert unmet + "1 -> 1.50x, 2 -> 1.43x)" in SloChunkPolicy(
        COST, 50, 16, 512, itl_during_prefill_ratio=1.4
    ).describe(8)
    assert "unmet" not in SloChunkPolicy(COST, 50, 16, 512, itl_during_prefill_ratio=1.5).describe(8)


@pytest.mark.parametrize("value", [1, 1.0, 0.5, -2, float("nan"), float("inf"), True, "1.5"])
def test_bad_itl_ratio_names_field_value_expectation_and_fix(value):
    with pytest.raises(TrtpipeError) as e:
        SloChunkPolicy(COST, 50, 16, 512, itl_during_prefill_ratio=value)
    msg = str(e.value)
    assert msg.startswith(f"itl_during_prefill_ratio = {value!r}: expected a finite number > 1")
    assert "--itl-during-prefill-ratio 1.5" in msg
    check_itl_ratio(np.float64(1.5))
