"""SLO-aware chunked prefill: the step-cost model's fit, chunk sizes computed by hand on a
synthetic cost model, and the scheduler applying them (no model)."""

import pytest

from trtpipe.runtime.block_pool import BlockPool
from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv_manager import KVCacheManager
from trtpipe.runtime.request import Request, SamplingParams
from trtpipe.runtime.scheduler import Scheduler
from trtpipe.runtime.slo_policy import SloChunkPolicy
from trtpipe.runtime.step_cost import StepCostModel, fit, with_error

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
    # 2 decodes: 5 + 2 = 7 ms; 43 ms left; 2 + n <= 43 -> n <= 41 -> 2 blocks = 32 (48 would be 50 ms)
    assert p.max_prefill_tokens(2, 200) == 32
    # 8 decodes: 13 ms; 37 left; n <= 35 -> 32
    assert p.max_prefill_tokens(8, 800) == 32
    # 30 decodes: 35 ms; 15 left; n <= 13 -> 0 blocks -> never below one block: 16
    assert p.max_prefill_tokens(30, 3000) == 16
    # no decode running: nobody's ITL is at stake -> max_num_tokens
    assert p.max_prefill_tokens(0, 0) == 512
    # 100 ms budget, 1 decode: 6 ms; 94 left; n <= 92 -> 80
    assert SloChunkPolicy(COST, 100, 16, 512).max_prefill_tokens(1, 10) == 80
    # the step budget also carries the decodes: max_num_tokens 40, 2 decodes -> room 38 -> 32
    assert SloChunkPolicy(COST, 1000, 16, 40).max_prefill_tokens(2, 10) == 32
    # the attention term: p2 = 1e-5 s per token*key, context 1000: 16 tokens cost
    # 2 + 16 + 0.01 * 16 * 1008 = 179.28 ms > budget -> one block
    att = StepCostModel(prefill_s=(0.002, 0.001, 1e-5), decode_s=COST.decode_s)
    assert SloChunkPolicy(att, 50, 16, 512).max_prefill_tokens(2, 200, prefill_context=1000) == 16
    assert "TPOT budget 50 ms" in p.describe(8) and "2 -> 32" in p.describe(8)
    with pytest.raises(TrtpipeError, match="tpot_budget_ms = 0"):
        SloChunkPolicy(COST, 0, 16, 512)


def test_fused_step_pays_one_intercept_and_gets_bigger_chunks_by_hand():
    fused = StepCostModel(prefill_s=COST.prefill_s, decode_s=COST.decode_s, fused=True)
    # two calls: 2 + 32 (prefill) + 5 + 2 (decode 2) = 41 ms; one call: 2 + 32 + 2 = 36 ms
    assert COST.step_time_s([(32, 0)], 2, 200) * 1e3 == pytest.approx(41.0)
    assert fused.step_time_s([(32, 0)], 2, 200) * 1e3 == pytest.approx(36.0)
    # either phase alone is the same call in both models
    assert fused.step_time_s([], 2, 200) == COST.step_time_s([], 2, 200) == pytest.approx(0.007)
    assert fused.step_time_s([(32, 0)], 0, 0) == COST.step_time_s([(32, 0)], 0, 0) == pytest.approx(0.034)
    # 50 ms budget, 2 decodes: 2 + n + 2 <= 50 -> n <= 46 -> 2 blocks (32); 4 decodes: n <= 44 -> 32;
    # 100 ms, 2 decodes: n <= 96 -> 96 (two calls: 2 + n + 7 <= 100 -> n <= 91 -> 80)
    assert SloChunkPolicy(fused, 50, 16, 512).max_prefill_tokens(2, 200) == 32
    assert SloChunkPolicy(fused, 100, 16, 512).max_prefill_tokens(2, 200) == 96
    assert SloChunkPolicy(COST, 100, 16, 512).max_prefill_tokens(2, 200) == 80
    assert "one call per mixed step" in SloChunkPolicy(fused, 50, 16, 512).describe(8)
    # held-out fused calls count in the stated error: 1 ms slower than predicted
    held = with_error(fused, [], [], [(32, 0, 2, 200, 0.037)])
    assert held.error_ms == pytest.approx(1.0) and held.fused
    assert StepCostModel.from_json(held.to_json()) == held


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
    # 1 decode: 6 ms; 44 left -> 2 + n <= 44 -> n <= 42 -> 32 per step; 200 = 6 x 32 + 8
    assert chunks == [32] * 6 + [8]
    assert sched.last_prefill_cap == 32
