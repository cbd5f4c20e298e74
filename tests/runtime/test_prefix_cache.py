"""Automatic prefix caching: block hashes, exact block ids in the pool and the KV manager, the
scheduler's hits, isolation, and 500 random requests through a fake engine that reads the pool
(outputs with the cache == outputs without it, preemptions forced by a small pool)."""

import hashlib
import struct
from collections import Counter

import numpy as np
import pytest

from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.kv.prefix_cache import extend_block_hashes, hash_block_tokens, root_hash
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.request import Request, RequestStatus
from trtpipe.runtime.sched.scheduler import Scheduler

# ---- hashes --------------------------------------------------------------------------------


def test_block_hash_is_chained_sha256_of_int64_tokens():
    """Hand-computed with hashlib/struct (independent of the module's packing)."""
    root = hashlib.sha256(b"trtpipe-prefix-v1" + struct.pack("<q", 3) + b"abc" + struct.pack("<q", 0)).digest()
    assert root_hash("abc") == root == root_hash("abc", "")
    h0 = hashlib.sha256(root + struct.pack("<4q", 5, 6, 7, 2**40)).digest()
    h1 = hashlib.sha256(h0 + struct.pack("<4q", 1, 1, 1, 1)).digest()
    assert extend_block_hashes([], [5, 6, 7, 2**40, 1, 1, 1, 1, 9, 9], 4, root) == [h0, h1]  # partial block: no hash
    assert hash_block_tokens(root, [5, 6, 7, 2**40]) == h0
    assert len(h0) == 32 and h0 != hash((root, (5, 6, 7, 2**40))).to_bytes(8, "little", signed=True)
    # Appending tokens keeps earlier hashes; extending an existing list only adds new blocks.
    hashes = extend_block_hashes([], [5, 6, 7, 2**40], 4, root)
    assert extend_block_hashes(hashes, [5, 6, 7, 2**40, 1, 1, 1, 1], 4, root) == [h0, h1]


def test_salt_and_build_hash_isolate_and_fields_are_length_prefixed():
    roots = {
        root_hash("b1"),
        root_hash("b1", "tenant-a"),
        root_hash("b2"),
        root_hash("b", "1"),
        root_hash("b1", "tenant-b"),
    }
    assert len(roots) == 5
    same = [extend_block_hashes([], [1, 2, 3, 4], 4, r)[0] for r in roots]
    assert len(set(same)) == 5  # the same tokens never share a name across builds or salts


# ---- block pool: exact ids, LRU order, eviction --------------------------------------------


def test_pool_cached_blocks_stay_in_the_free_queue_until_evicted():
    pool = BlockPool(6)  # usable 1..5
    a = pool.allocate(3)
    assert a == [1, 2, 3]
    assert pool.cache_block(1, b"h1") and pool.cache_block(2, b"h2")
    assert not pool.cache_block(3, b"h1")  # the hash is taken by block 1: block 3 stays uncached
    assert pool.cached_block(b"h1") == 1 and pool.block_hash(3) is None
    pool.free([3, 2, 1])  # tail of the prefix first
    assert pool.free_block_ids() == [4, 5, 3, 2, 1] and pool.num_used == 0 and pool.num_cached == 2
    pool.touch([1])  # a hit takes block 1 out of the middle of the LRU queue
    assert pool.ref_count(1) == 1 and pool.free_block_ids() == [4, 5, 3, 2]
    assert pool.allocate(3) == [4, 5, 3]  # uncached blocks first here (queue order), no eviction
    assert pool.num_evictions == 0 and pool.cached_block(b"h2") == 2
    assert pool.allocate(1) == [2]  # evicts block 2: its hash is forgotten
    assert pool.num_evictions == 1 and pool.cached_block(b"h2") is None and pool.block_hash(2) is None
    assert pool.allocate(1) is None  # block 1 is referenced: never handed out
    pool.touch([1])
    assert pool.ref_count(1) == 2
    with pytest.raises(AssertionError, match="uncached"):
        pool.touch([4])
    pool.cache_block(4, b"h4")
    pool.free([4])
    assert pool.reset_prefix_cache() == 1  # block 4 (free) forgets its hash, block 1 (used) keeps
    assert pool.cached_block(b"h4") is None and pool.cached_block(b"h1") == 1


# ---- KV manager: hit tables ----------------------------------------------------------------


def _hashes(tokens, bs, salt=None):
    return extend_block_hashes([], tokens, bs, root_hash("build", salt))


def test_manager_hit_shares_blocks_and_allocates_the_rest():
    pool = BlockPool(12)
    kv = KVCacheManager(pool, 4)
    tokens = list(range(100, 110))  # 2 full blocks + 2 tokens
    assert kv.allocate_slots("a", 10, 0)
    assert kv.block_table("a") == [1, 2, 3]
    h = _hashes(tokens, 4)
    kv.cache_full_blocks("a", h, 10)
    assert pool.num_cached == 2 and pool.cached_block(h[0]) == 1 and pool.cached_block(h[1]) == 2
    assert kv.find_cached_prefix(h) == [1, 2]
    assert kv.find_cached_prefix(_hashes(tokens, 4, "salt")) == []
    # b: same 8-token prefix, then 3 new tokens -> computes positions 8..10 only.
    assert kv.allocate_slots("b", 3, 8, cached_block_ids=[1, 2])
    assert kv.block_table("b") == [1, 2, 4]
    assert kv.slot_mapping("b", 8, 3) == [16, 17, 18]
    assert pool.ref_count(1) == pool.ref_count(2) == 2
    kv.free("a")
    kv.free("b")
    assert pool.free_block_ids() == [5, 6, 7, 8, 9, 10, 11, 3, 4, 2, 1]
    # all free, 1 and 2 still cached: a third request hits them out of the free queue
    assert kv.allocate_slots("c", 1, 8, cached_block_ids=[1, 2])
    assert kv.block_table("c") == [1, 2, 5] and pool.free_block_ids() == [6, 7, 8, 9, 10, 11, 3, 4]


def test_manager_hit_does_not_fit_changes_nothing():
    pool = BlockPool(4)  # 3 usable
    kv = KVCacheManager(pool, 4)
    assert kv.allocate_slots("a", 8, 0)
    kv.cache_full_blocks("a", _hashes(list(range(8)), 4), 8)
    kv.free("a")
    assert pool.free_block_ids() == [3, 2, 1]
    # hit on [1, 2] + 2 new blocks: 1 free block is left after the touch -> does not fit
    assert not kv.allocate_slots("b", 5, 8, cached_block_ids=[1, 2])
    assert "b" not in kv and pool.free_block_ids() == [3, 2, 1] and pool.num_cached == 2
    assert kv.allocate_slots("b", 4, 8, cached_block_ids=[1, 2])
    assert kv.block_table("b") == [1, 2, 3]


def test_sliding_window_hit_does_not_reference_dead_blocks():
    """W = 5, bs = 4: a hit of 3 blocks (c = 12) only needs positions > 12 - 5 = 7, i.e. blocks
    2.. ; blocks 0 and 1 become the null block at once and are not referenced."""
    pool = BlockPool(10)
    kv = KVCacheManager(pool, 4, sliding_window=5)
    tokens = list(range(14))
    h = _hashes(tokens, 4)
    for start, n in ((0, 4), (4, 4), (8, 6)):  # prefill in chunks; the window releases as it goes
        assert kv.allocate_slots("a", n, start)
        kv.cache_full_blocks("a", h, start + n)
    assert kv.block_table("a") == [0, 2, 3, 4]  # block 1 released when the chunk at 8 started
    assert pool.num_cached == 3 and kv.find_cached_prefix(h[:3]) == [1, 2, 3]
    assert kv.allocate_slots("b", 2, 12, cached_block_ids=[1, 2, 3])
    assert kv.block_table("b") == [0, 0, 3, 5]
    assert pool.ref_count(1) == 0 and pool.ref_count(2) == 1 and pool.ref_count(3) == 2


# ---- scheduler -----------------------------------------------------------------------------


def _sched(num_blocks=64, block_size=4, max_num_tokens=64, max_batch_size=8, window=0, build="b1", on=True):
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, block_size, window)
    sched = Scheduler(
        kv, max_num_tokens, max_batch_size, 4096, eos_token_ids=(0,), enable_prefix_caching=on, build_hash=build
    )
    return sched, pool


def _run(sched, token=7):
    step = sched.schedule()
    sampled = {p.request_id: token for p in step.prefills if p.is_last_chunk}
    sampled.update({d.request_id: token for d in step.decodes})
    sched.update(step, sampled)
    return step


def _req(rid, prompt, max_new=2, salt=None):
    return Request(rid, tuple(prompt), SamplingParams(max_new_tokens=max_new, ignore_eos=True), cache_salt=salt)


def test_second_request_prefills_only_the_uncached_rest():
    sched, pool = _sched()
    shared = list(range(1, 11))  # 10 tokens: 2 full blocks
    a = _req("a", shared + [50, 51])
    sched.add_request(a)
    step = _run(sched)
    assert step.prefills[0].start_position == 0 and a.num_cached_tokens == 0
    b = _req("b", shared + [60])
    sched.add_request(b)
    step = _run(sched)
    (p,) = step.prefills
    assert (p.request_id, p.start_position, p.token_ids) == ("b", 8, (9, 10, 60))
    assert p.block_table == (1, 2, 5)  # a holds [1, 2, 3, 4] (decode at 12); 1, 2 are shared
    assert b.num_cached_tokens == 8
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (12 + 11, 8)


def test_the_last_token_is_always_computed():
    sched, pool = _sched()
    prompt = list(range(1, 9))  # exactly 2 blocks
    sched.add_request(_req("a", prompt, max_new=1))
    _run(sched)
    b = _req("b", prompt, max_new=1)
    sched.add_request(b)
    (p,) = _run(sched).prefills
    assert p.start_position == 4 and p.token_ids == (5, 6, 7, 8) and p.is_last_chunk  # hit 1 block, not 2
    assert b.num_cached_tokens == 4


def test_other_salt_and_other_build_get_no_hit_and_off_means_off():
    prompt = list(range(1, 20))
    for salt_b, on, want in ((None, True, 16), ("t2", True, 0), (None, False, 0)):  # other build: below
        sched, pool = _sched(on=on)
        sched.add_request(_req("a", prompt, salt=None))
        _run(sched)
        b = _req("b", prompt, salt=salt_b)
        sched.add_request(b)
        _run(sched)
        assert b.num_cached_tokens == want, (salt_b, on)
    # A second artifact's scheduler on the same pool would never match: its root differs.
    s1, pool = _sched(build="b1")
    s1.add_request(_req("a", prompt))
    _run(s1)
    s2 = Scheduler(s1.kv_manager, 64, 8, 4096, enable_prefix_caching=True, build_hash="b2")
    b = _req("b", prompt)
    s2.add_request(b)
    _run(s2)
    assert b.num_cached_tokens == 0


def test_preempted_request_finds_its_own_blocks_again():
    sched, pool = _sched(num_blocks=9, block_size=4, max_num_tokens=32)  # 8 usable blocks
    a = _req("a", range(1, 14), max_new=12)  # 13 prompt tokens: 4 blocks, grows to 25 tokens
    b = _req("b", range(101, 114), max_new=12)
    sched.add_request(a)
    sched.add_request(b)
    preempted = []
    for _ in range(60):
        if not sched.has_unfinished():
            break
        preempted += _run(sched).preempted
    assert "b" in preempted and b.num_preemptions >= 1
    assert a.is_finished and b.is_finished and sched.prefix_cache_hits > 0
    assert pool.num_used == 0


# ---- 500 random requests through a fake engine that reads the pool ---------------------------

VOCAB = 1000


def _mix(a: int, b: int) -> int:
    return (a * 6364136223846793005 + b * 1442695040888963407 + 12345) % (1 << 61)


class FakeEngine:
    """A deterministic 'model' whose KV and outputs depend on what the pool holds.

    kv[p] = mix(kv[p-1], token[p], p), written at the slot of position p; reading kv[p-1] goes
    through the block table. The next token is a function of every KV value the query at the
    last position can see (all of them, or the last W with a window), read from the pool. A
    wrong block in a table, a stale cached block or a block the window should still hold changes
    the outputs (or trips an assert), exactly as it would corrupt a real model's attention.
    """

    def __init__(self, block_size: int, window: int):
        self.bs, self.window, self.store = block_size, window, {}

    def _slot(self, table, pos):
        block = table[pos // self.bs]
        assert block != 0, f"position {pos} is read but its block was released"
        return block * self.bs + pos % self.bs

    def run(self, token_ids, start, table, slots):
        for i, (tok, slot) in enumerate(zip(token_ids, slots)):
            pos = start + i
            prev = self.store[self._slot(table, pos - 1)] if pos > 0 else 0
            self.store[slot] = _mix(prev, tok * 7919 + pos)
        last = start + len(token_ids) - 1
        lo = max(0, last - self.window + 1) if self.window else 0
        acc = 0
        for pos in range(lo, last + 1):
            acc = _mix(acc, self.store[self._slot(table, pos)])
        return acc % VOCAB


def _traffic(seed, prefix_caching, num_requests=500):
    rng = np.random.default_rng(seed)
    bs, window = 4, (0 if seed % 2 == 0 else 9)
    # 156 / 52 usable tokens: forces preemptions (the window bounds each sequence's blocks)
    pool = BlockPool(40 if window == 0 else 14)
    kv = KVCacheManager(pool, bs, window)
    sched = Scheduler(kv, 24, 6, 128, eos_token_ids=(0,), enable_prefix_caching=prefix_caching, build_hash="fake")
    engine = FakeEngine(bs, window)
    shared = [tuple(rng.integers(1, VOCAB, 60)) for _ in range(4)]  # system prompts
    requests = []
    for i in range(num_requests):
        k = int(rng.integers(0, 61))  # shared prefix of random length (0 = none)
        tail = tuple(rng.integers(1, VOCAB, int(rng.integers(1, 20))))
        salt = "other" if rng.random() < 0.1 else None
        requests.append(
            Request(
                f"r{i}",
                shared[int(rng.integers(0, 4))][:k] + tail,
                SamplingParams(max_new_tokens=int(rng.integers(1, 12))),
                cache_salt=salt,
            )
        )
    arrivals = np.sort(rng.integers(0, 900, num_requests))
    by_id = {r.request_id: r for r in requests}
    nxt, num_preempted = 0, 0
    for step_index in range(50_000):
        while nxt < num_requests and arrivals[nxt] <= step_index:
            sched.add_request(requests[nxt])
            nxt += 1
        if nxt == num_requests and not sched.has_unfinished():
            break
        step = sched.schedule()
        num_preempted += len(step.preempted)
        _check_pool(sched, pool, kv, step, by_id)
        sampled = {}
        for p in step.prefills:
            tok = engine.run(p.token_ids, p.start_position, p.block_table, p.slot_mapping)
            if p.is_last_chunk:
                sampled[p.request_id] = tok
        for d in step.decodes:
            sampled[d.request_id] = engine.run((d.token_id,), d.position, d.block_table, (d.slot,))
        sched.update(step, sampled)
    else:
        pytest.fail("did not drain")
    # At the end every block is free; the cached ones are cached-and-unreferenced.
    assert pool.num_free == pool.num_blocks - 1 and pool.num_used == 0 and kv.num_seqs == 0
    assert all(pool.ref_count(b) == 0 for b in range(1, pool.num_blocks))
    outs = {r.request_id: (tuple(r.output_token_ids), r.finish_reason) for r in requests}
    return outs, sched, num_preempted, requests


def _check_pool(sched, pool, kv, step, by_id):
    """No block owned twice by one sequence; ref count = owners; referenced blocks never free;
    nobody writes into a shared or cached block."""
    owners = Counter()
    for r in by_id.values():
        if r.status is RequestStatus.RUNNING:
            table = [b for b in kv.block_table(r.request_id) if b]
            assert len(table) == len(set(table)), "a sequence owns a block twice"
            owners.update(table)
        else:
            assert r.request_id not in kv
    free = set(pool.free_block_ids())
    for b in range(1, pool.num_blocks):
        assert pool.ref_count(b) == owners.get(b, 0)
        assert (b in free) == (owners.get(b, 0) == 0), f"block {b} free while referenced (or leaked)"
    bs = kv.block_size
    written = [s // bs for p in step.prefills for s in p.slot_mapping] + [d.slot // bs for d in step.decodes]
    for b in written:
        assert pool.ref_count(b) == 1 and pool.block_hash(b) is None, f"write into shared/cached block {b}"


@pytest.mark.parametrize("seed", [0, 1])
def test_500_requests_with_and_without_prefix_cache_give_identical_outputs(seed):
    with_cache, sched, preempted_on, reqs = _traffic(seed, True)
    without, sched_off, preempted_off, _ = _traffic(seed, False)
    assert with_cache == without
    assert preempted_on > 0 and preempted_off > 0  # the small pool forced preemptions
    assert sched.prefix_cache_hits > 0.05 * sched.prefix_cache_queries  # the cache did work
    assert sched.kv_manager.block_pool.num_evictions > 0  # and it was evicted under pressure
    assert sched_off.prefix_cache_queries == 0
    salted = [r for r in reqs if r.cache_salt == "other"]
    assert salted and sum(r.num_cached_tokens for r in salted) < sum(r.num_cached_tokens for r in reqs)
