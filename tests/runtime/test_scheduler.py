"""Scheduler: chunked prefill, continuous decode batching, preemption, aborts, and a property
test driving thousands of random requests through a fake engine (no model)."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtpipe.runtime.errors import RequestError, TrtpipeError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.request import Request, RequestStatus, new_request
from trtpipe.runtime.sched.scheduler import ScheduledDecode, ScheduledPrefill, Scheduler

EOS = 0


def make(num_blocks=128, block_size=16, max_num_tokens=256, max_batch_size=8, max_seq_len=4096, window=0):
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, block_size, window)
    return Scheduler(kv, max_num_tokens, max_batch_size, max_seq_len, eos_token_ids=(EOS,)), pool


def req(rid, prompt_len, max_new=16, first=1, **kw):
    return Request(rid, tuple(range(first, first + prompt_len)), SamplingParams(max_new_tokens=max_new, **kw))


def run_step(sched, token=lambda rid: 7):
    """schedule -> fake engines -> update; returns (step, finished)."""
    step = sched.schedule()
    sampled = {p.request_id: token(p.request_id) for p in step.prefills if p.is_last_chunk}
    sampled.update({d.request_id: token(d.request_id) for d in step.decodes})
    return step, sched.update(step, sampled)


def test_long_prompt_is_prefilled_in_chunks():
    sched, pool = make(num_blocks=128, block_size=16, max_num_tokens=256)
    r = req("r", 1000, max_new=2)
    sched.add_request(r)
    chunks = []
    for _ in range(4):
        step, finished = run_step(sched)
        assert not step.decodes and len(step.prefills) == 1 and not finished
        chunks.append(step.prefills[0])
    assert [c.num_tokens for c in chunks] == [256, 256, 256, 232]
    assert [c.start_position for c in chunks] == [0, 256, 512, 768]
    assert [c.is_last_chunk for c in chunks] == [False, False, False, True]
    for c in chunks:
        assert c.token_ids == tuple(range(1 + c.start_position, 1 + c.context_len))
        # Blocks 1, 2, 3... in order, so position p lives in slot (1 + p // 16) * 16 + p % 16 = 16 + p.
        assert c.slot_mapping == tuple(range(16 + c.start_position, 16 + c.context_len))
        assert c.block_table == tuple(range(1, 1 + -(-c.context_len // 16)))
    assert r.output_token_ids == [7]  # only the last chunk's token is kept
    step, finished = run_step(sched)
    assert step.decodes == (ScheduledDecode("r", 7, 1000, tuple(range(1, 64)), 16 + 1000),)
    assert finished == [r] and r.finish_reason == "length" and r.output_token_ids == [7, 7]
    assert pool.num_free == 127 and not sched.has_unfinished()


def test_sequences_at_different_steps_share_one_decode_batch():
    sched, _ = make(max_num_tokens=64)
    sched.add_request(req("a", 3, max_new=10))
    run_step(sched)  # a: prefill
    run_step(sched)  # a: decode position 3
    sched.add_request(req("b", 5, max_new=10))
    step, _ = run_step(sched)  # a decodes while b prefills (mixed step)
    assert [d.request_id for d in step.decodes] == ["a"] and [p.request_id for p in step.prefills] == ["b"]
    step, _ = run_step(sched)
    assert [(d.request_id, d.position) for d in step.decodes] == [("a", 5), ("b", 5)]
    sched.add_request(req("c", 1, max_new=10))
    run_step(sched)
    step, _ = run_step(sched)
    assert [(d.request_id, d.position) for d in step.decodes] == [("a", 7), ("b", 7), ("c", 1)]
    assert not step.prefills


def test_decodes_first_then_prefill_chunks_within_the_budget_and_batch_size():
    sched, _ = make(max_num_tokens=8, max_batch_size=2)
    sched.add_request(req("a", 2, max_new=10))
    run_step(sched)
    sched.add_request(req("b", 20, max_new=2))
    sched.add_request(req("c", 2, max_new=2))
    step, _ = run_step(sched)
    assert [d.request_id for d in step.decodes] == ["a"]
    assert [(p.request_id, p.start_position, p.num_tokens) for p in step.prefills] == [("b", 0, 7)]
    assert sched.num_running == 2 and sched.num_waiting == 1  # c: batch is full
    step, _ = run_step(sched)
    assert [(p.request_id, p.start_position, p.num_tokens) for p in step.prefills] == [("b", 7, 7)]
    step, _ = run_step(sched)
    assert [(p.request_id, p.start_position, p.num_tokens, p.is_last_chunk) for p in step.prefills] == [
        ("b", 14, 6, True)
    ]
    assert step.num_tokens == 7
    step, finished = run_step(sched)  # b decodes and finishes (2 tokens): c gets its place
    assert [r.request_id for r in finished] == ["b"]
    step, _ = run_step(sched)
    assert [p.request_id for p in step.prefills] == ["c"]


def test_preemption_when_the_pool_is_full_then_both_complete():
    # 4 usable blocks of 4 tokens; a and b hold 2 blocks each after their 6-token prompts.
    sched, pool = make(num_blocks=5, block_size=4, max_num_tokens=16, max_batch_size=4, max_seq_len=64)
    a, b = req("a", 6, max_new=8, first=10), req("b", 6, max_new=8, first=20)
    sched.add_request(a)
    sched.add_request(b)
    step, _ = run_step(sched)
    assert [p.block_table for p in step.prefills] == [(1, 2), (3, 4)] and pool.num_free == 0
    run_step(sched)  # positions 6
    run_step(sched)  # positions 7
    step, _ = run_step(sched, token=lambda rid: 100 + len(a.output_token_ids))
    # a's position 8 needs a third block: b (newest) is preempted and its blocks freed at once.
    assert step.preempted == ("b",)
    assert [(d.request_id, d.position, d.block_table) for d in step.decodes] == [("a", 8, (1, 2, 4))]
    assert b.status is RequestStatus.PREEMPTED and b.num_preemptions == 1 and "b" not in sched.kv_manager
    assert b.output_token_ids == [7, 7, 7] and sched.num_waiting == 1
    steps = []
    while sched.has_unfinished():
        steps.append(run_step(sched)[0])
    # b recomputes its prompt plus its 3 generated tokens, then finishes normally.
    recompute = [p for s in steps for p in s.prefills if p.request_id == "b"]
    assert len(recompute) == 1
    assert recompute[0].token_ids == tuple(range(20, 26)) + (7, 7, 7) and recompute[0].start_position == 0
    assert a.status is b.status is RequestStatus.FINISHED_LENGTH
    assert len(a.output_token_ids) == len(b.output_token_ids) == 8
    assert pool.num_free == 4


def test_request_that_never_fits_is_finished_with_an_error_not_queued_forever():
    """More KV than the whole pool: finished at once (a too-long prompt never gets this far:
    new_request refuses it, test_invalid_requests_and_settings)."""
    sched, pool = make(num_blocks=5, block_size=4, max_num_tokens=8, max_batch_size=2, max_seq_len=64)
    too_big = req("big", 10, max_new=10)  # KV for 19 tokens = 5 blocks > 4
    fits = req("ok", 10, max_new=7)  # KV for 16 tokens = 4 blocks
    for r in (too_big, fits):
        sched.add_request(r)
    assert too_big.status is RequestStatus.FINISHED_ERROR and "pool has 4" in too_big.error_message
    step, finished = run_step(sched)
    assert finished == [too_big] and [p.request_id for p in step.prefills] == ["ok"]
    while sched.has_unfinished():
        run_step(sched)
    assert fits.finish_reason == "length" and len(fits.output_token_ids) == 7 and pool.num_free == 4


def test_sliding_window_bounds_memory_so_long_sequences_fit_a_small_pool():
    sched, pool = make(num_blocks=5, block_size=4, max_num_tokens=4, max_batch_size=1, max_seq_len=1000, window=4)
    r = req("w", 20, max_new=60)  # 79 KV tokens, but at most 3 blocks alive at once
    sched.add_request(r)
    while sched.has_unfinished():
        step, _ = run_step(sched)
        assert sched.kv_blocks_used <= 3
        for d in step.decodes:
            assert all(d.block_table[p // 4] != 0 for p in range(d.position - 3, d.position + 1))
    assert r.finish_reason == "length" and len(r.output_token_ids) == 60 and pool.num_free == 4


def test_abort_frees_blocks_at_once_anywhere_in_the_lifecycle():
    sched, pool = make(num_blocks=16, block_size=4, max_num_tokens=8, max_batch_size=1)
    sched.add_request(req("run", 6))
    sched.add_request(req("wait", 6))
    run_step(sched)
    assert pool.num_used == 2
    assert sched.abort("wait").status is RequestStatus.FINISHED_ABORTED and sched.num_waiting == 0
    step = sched.schedule()
    aborted = sched.abort("run")  # client disconnect while the engine runs the step
    assert aborted.finish_reason == "abort" and pool.num_used == 0
    assert sched.update(step, {"run": 5}) == [] and aborted.output_token_ids == [7]
    assert sched.abort("run") is None and sched.abort("nope") is None
    assert not sched.has_unfinished()
    # finish_request: stop strings found by the detokenizer layer, engine errors.
    sched.add_request(req("s", 3))
    run_step(sched)
    done = sched.finish_request("s", RequestStatus.FINISHED_STOPPED)
    assert done.finish_reason == "stop" and pool.num_used == 0


def test_stop_conditions():
    sched, _ = make(max_seq_len=10)
    rs = {
        "eos": req("eos", 3, max_new=50),
        "ign": req("ign", 3, max_new=3, ignore_eos=True),
        "stoptok": req("stoptok", 3, max_new=50, stop_token_ids=(42,)),
        "seqlen": req("seqlen", 6, max_new=50),
    }
    for r in rs.values():
        sched.add_request(r)
    script = {"eos": [5, EOS], "ign": [EOS, EOS, EOS], "stoptok": [5, 6, 42], "seqlen": [5] * 10}
    while sched.has_unfinished():
        run_step(sched, token=lambda rid: script[rid][len(rs[rid].output_token_ids)])
    assert (rs["eos"].finish_reason, rs["eos"].output_token_ids) == ("stop", [5, EOS])
    assert (rs["ign"].finish_reason, rs["ign"].output_token_ids) == ("length", [EOS] * 3)
    assert (rs["stoptok"].finish_reason, rs["stoptok"].output_token_ids) == ("stop", [5, 6, 42])
    assert rs["seqlen"].finish_reason == "length" and rs["seqlen"].num_tokens == 10


def test_invalid_requests_and_settings():
    """new_request is the one place a request is checked (field named); the scheduler refuses
    only what it alone knows: an id in use, bad limits."""
    sched, _ = make()
    checks = dict(max_seq_len=64, vocab_size=100)
    with pytest.raises(RequestError, match="prompt_token_ids is empty") as e:
        new_request("e", (), SamplingParams(), **checks)
    assert e.value.field == "prompt"
    with pytest.raises(RequestError, match="top_p"):
        new_request("p", (1, 2), SamplingParams(top_p=2.0), **checks)
    with pytest.raises(RequestError, match=r"prompt token id 100: expected ids in \[0, 100\)"):
        new_request("v", (1, 100), SamplingParams(), **checks)
    with pytest.raises(RequestError, match="max_seq_len = 64") as e:
        new_request("long", tuple(range(1, 70)), SamplingParams(), **checks)
    assert (e.value.field, e.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(RequestError, match="cache_salt"):
        new_request("s", (1, 2), SamplingParams(), cache_salt=3, **checks)
    ok = new_request("ok", [5, 6], SamplingParams(), arrival_time_s=1.5, cache_salt="t", **checks)
    assert (ok.prompt_token_ids, ok.arrival_time_s, ok.cache_salt, ok.status) == (
        (5, 6),
        1.5,
        "t",
        RequestStatus.WAITING,
    )
    sched.add_request(req("d", 3))
    with pytest.raises(RequestError, match="already in use"):
        sched.add_request(req("d", 3))
    with pytest.raises(TrtpipeError, match="max_num_tokens = 4 < max_batch_size = 8"):
        make(max_num_tokens=4, max_batch_size=8)
    sched.schedule()
    with pytest.raises(AssertionError):
        sched.schedule()


# ---- property test: random arrivals, lengths, aborts; a fake engine returning random tokens ----

NUM_REQUESTS_PER_EXAMPLE = 125
NUM_EXAMPLES = 20  # 2500 requests in total


@settings(max_examples=NUM_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    block_size=st.sampled_from([1, 2, 4, 8]),
    pool_tokens=st.integers(32, 200),
    max_batch_size=st.integers(1, 8),
    extra_tokens=st.integers(0, 40),
    window=st.sampled_from([0, 0, 5, 16]),
    max_seq_len=st.integers(16, 128),
)
def test_random_traffic_never_double_owns_never_leaks_never_deadlocks(
    seed, block_size, pool_tokens, max_batch_size, extra_tokens, window, max_seq_len
):
    rng = np.random.default_rng(seed)
    num_blocks = -(-pool_tokens // block_size) + 1
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, block_size, window)
    max_num_tokens = max_batch_size + extra_tokens
    sched = Scheduler(kv, max_num_tokens, max_batch_size, max_seq_len, eos_token_ids=(EOS,))
    arrivals = np.sort(rng.integers(0, 150, NUM_REQUESTS_PER_EXAMPLE))
    requests = [
        Request(
            f"r{i}",
            # prompts new_request would refuse (no room for an output token) never reach it
            tuple(rng.integers(1, 50, int(rng.integers(1, min(40, max_seq_len))))),
            SamplingParams(max_new_tokens=int(rng.integers(1, 24)), ignore_eos=bool(rng.random() < 0.3)),
        )
        for i in range(NUM_REQUESTS_PER_EXAMPLE)
    ]
    by_id = {r.request_id: r for r in requests}
    next_arrival = 0
    for step_index in range(20_000):
        while next_arrival < len(requests) and arrivals[next_arrival] <= step_index:
            sched.add_request(requests[next_arrival])
            next_arrival += 1
        if next_arrival == len(requests) and not sched.has_unfinished():
            break
        if rng.random() < 0.05:  # cancellation / client disconnect of some live request
            live = [r for r in requests[:next_arrival] if not r.is_finished]
            if live:
                sched.abort(live[int(rng.integers(len(live)))].request_id)
        had_work = sched.num_running + sched.num_waiting > 0
        step = sched.schedule()
        _check_step(sched, step, by_id, had_work)
        _check_ownership(sched, pool, kv, requests[:next_arrival])
        if rng.random() < 0.02 and step.decodes:  # disconnect while the engine runs
            sched.abort(step.decodes[0].request_id)
        if rng.random() < 0.01 and step.prefills:  # an engine error for one request
            sched.finish_request(step.prefills[0].request_id, RequestStatus.FINISHED_ERROR, "engine")
        sampled = {p.request_id: int(rng.integers(0, 50)) for p in step.prefills if p.is_last_chunk}
        sampled.update({d.request_id: int(rng.integers(0, 50)) for d in step.decodes})
        for r in sched.update(step, sampled):
            assert r.is_finished and r.request_id not in kv
        _check_ownership(sched, pool, kv, requests[:next_arrival])
    else:
        pytest.fail("scheduler did not drain: deadlock or livelock")
    assert pool.num_free == num_blocks - 1 and kv.num_seqs == 0
    for r in requests:
        assert r.is_finished
        if r.finish_reason == "length":
            assert len(r.output_token_ids) == r.sampling_params.max_new_tokens or r.num_tokens >= max_seq_len
        elif r.finish_reason == "stop":
            assert r.output_token_ids[-1] == EOS and not r.sampling_params.ignore_eos


def _check_step(sched, step, by_id, had_work):
    assert step.num_tokens <= sched.max_num_tokens
    assert sched.num_running <= sched.max_batch_size
    ids = [p.request_id for p in step.prefills] + [d.request_id for d in step.decodes]
    assert len(ids) == len(set(ids))
    assert not had_work or not step.is_empty, "a step with work scheduled nothing"
    running = [r for r in by_id.values() if r.status is RequestStatus.RUNNING]
    decoding = {r.request_id for r in running if not r.is_prefilling}
    assert {d.request_id for d in step.decodes} == decoding  # one decode batch for all
    bs = sched.kv_manager.block_size
    for p in step.prefills:
        r = by_id[p.request_id]
        assert isinstance(p, ScheduledPrefill) and p.start_position == r.num_computed_tokens
        assert p.token_ids == r.all_token_ids[p.start_position : p.context_len]
        assert p.is_last_chunk == (p.context_len == r.num_tokens)
        for pos, slot in zip(range(p.start_position, p.context_len), p.slot_mapping):
            assert p.block_table[pos // bs] != 0 and slot == p.block_table[pos // bs] * bs + pos % bs
    for d in step.decodes:
        r = by_id[d.request_id]
        assert d.position == r.num_tokens - 1 and d.token_id == r.output_token_ids[-1]
        assert d.slot == d.block_table[d.position // bs] * bs + d.position % bs
    for rid in step.preempted:
        assert by_id[rid].status in (RequestStatus.PREEMPTED, RequestStatus.FINISHED_ABORTED)


def _check_ownership(sched, pool, kv, arrived):
    owners = Counter()
    for r in arrived:
        if r.status is RequestStatus.RUNNING:
            owners.update(b for b in kv.block_table(r.request_id) if b)
        else:
            assert r.request_id not in kv  # waiting, preempted and finished requests own nothing
    assert all(n == 1 for n in owners.values()), "a block is owned by two sequences"
    assert all(pool.ref_count(b) == 1 for b in owners)
    assert pool.num_used == len(owners) == sched.kv_blocks_used


def test_prompt_length_rule_boundary_one_rule_for_scheduler_and_llm():
    """max_seq_len bounds prompt + output: a prompt of max_seq_len - 1 tokens runs and gets
    exactly one token (then "length"); a prompt of exactly max_seq_len tokens is refused."""
    from trtpipe.runtime.sched.request import prompt_length_error

    assert prompt_length_error(9, 10) is None
    assert "prompt has 10 tokens; expected fewer than max_seq_len = 10" in prompt_length_error(10, 10)
    sched, pool = make(max_seq_len=10)
    with pytest.raises(RequestError) as e:
        new_request("exact", tuple(range(1, 11)), SamplingParams(max_new_tokens=50), max_seq_len=10, vocab_size=100)
    assert str(e.value) == prompt_length_error(10, 10)
    fits = new_request("fits", tuple(range(1, 10)), SamplingParams(max_new_tokens=50), max_seq_len=10, vocab_size=100)
    sched.add_request(fits)
    _, finished = run_step(sched)
    assert finished == [fits] and fits.finish_reason == "length" and fits.output_token_ids == [7]
    assert pool.num_used == 0 and not sched.has_unfinished()
