"""n > 1 in the scheduler, exact block ids: the choices wait for the first choice's prefill, fork
its prompt blocks (ref counts, no recompute), and the partial last block is copied on write at
the first decode; every block is free at the end, after an abort too."""

from __future__ import annotations

from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.request import new_request
from trtpipe.runtime.sched.scheduler import Scheduler

BS = 4


def _setup(n=3, prompt_len=10, fork_choices=True):
    pool = BlockPool(32)
    kv = KVCacheManager(pool, BS, 0)
    sched = Scheduler(kv, 64, 8, 64, eos_token_ids=(0,), fork_choices=fork_choices)
    prompt = list(range(1, prompt_len + 1))
    reqs = []
    for i in range(n):
        r = new_request(f"c{i}", prompt, SamplingParams(max_new_tokens=4), max_seq_len=64, vocab_size=100)
        r.share_prefix_with = "c0" if i else None
        sched.add_request(r)
        reqs.append(r)
    return pool, kv, sched, reqs


def _step(sched, tokens):
    """One step as the step runner does it: schedule, reserve forks, update with ``tokens``."""
    step = sched.schedule()
    forks = [c.request_id for p in step.prefills for c in sched.fork_candidates(p)]
    copies = sched.kv_manager.take_pending_copies()
    ids = [p.request_id for p in step.prefills if p.is_last_chunk] + [d.request_id for d in step.decodes] + forks
    finished = sched.update(step, {rid: tokens[rid] for rid in ids})
    return step, forks, copies, finished


def test_choices_fork_the_prompt_blocks_then_copy_the_partial_block_on_write():
    pool, kv, sched, reqs = _setup()
    step, forks, copies, _ = _step(sched, {"c0": 50, "c1": 51, "c2": 52})
    assert [p.request_id for p in step.prefills] == ["c0"]  # the choices did not prefill
    assert forks == ["c1", "c2"] and copies == []
    table = kv.block_table("c0")
    assert len(table) == 3 and all(kv.block_table(c) == table for c in ("c1", "c2"))  # 10 tokens: 2 full + 1 partial
    assert [pool.ref_count(b) for b in table] == [3, 3, 3] and pool.num_used == 3
    assert [r.output_token_ids for r in reqs] == [[50], [51], [52]]
    step, forks, copies, _ = _step(sched, {"c0": 60, "c1": 61, "c2": 62})
    assert [d.request_id for d in step.decodes] == ["c0", "c1", "c2"] and forks == []
    # c0 and c1 write position 10 into the shared partial block: each gets a fresh block holding a
    # copy of positions 8-9; c2, the last owner, writes into the original
    partial = table[2]
    assert copies == [(partial, kv.block_table("c0")[2]), (partial, kv.block_table("c1")[2])]
    assert kv.block_table("c2")[2] == partial
    assert [kv.block_table(c)[:2] for c in ("c0", "c1", "c2")] == [table[:2]] * 3  # full blocks shared
    assert pool.num_used == 5  # 2 shared full + 3 partial, not 3 x 3
    assert sched.kv_blocks_used == 5


def test_every_block_is_free_after_the_choices_finish_or_abort():
    pool, kv, sched, reqs = _setup()
    _step(sched, {"c0": 50, "c1": 51, "c2": 52})
    sched.abort("c1")
    while sched.has_unfinished():
        step = sched.schedule()
        sched.update(step, {d.request_id: 7 for d in step.decodes})
    assert pool.num_used == 0 and [r.finish_reason for r in reqs] == ["length", "abort", "length"]


def test_without_forking_the_choices_wait_then_prefill():
    pool, kv, sched, reqs = _setup(n=2, fork_choices=False)
    step, forks, _, _ = _step(sched, {"c0": 50})
    assert [p.request_id for p in step.prefills] == ["c0"] and forks == []
    step, _, _, _ = _step(sched, {"c0": 60, "c1": 51})
    assert [p.request_id for p in step.prefills] == ["c1"]  # admitted once c0 had prefilled
