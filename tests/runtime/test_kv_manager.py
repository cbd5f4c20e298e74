"""KVCacheManager: exact block tables and slots, free order, fork/copy-on-write, window release."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.kv.planning import cdiv


def make(num_blocks=10, block_size=4, sliding_window=0):
    pool = BlockPool(num_blocks)
    return pool, KVCacheManager(pool, block_size, sliding_window)


def test_allocate_append_slots_and_free_order():
    pool, kv = make(10, 4)
    assert kv.allocate_slots("a", 6, 0)
    assert kv.block_table("a") == [1, 2]
    assert kv.slot_mapping("a", 0, 6) == [4, 5, 6, 7, 8, 9]  # block*4 + pos%4
    assert kv.allocate_slots("b", 3, 0)
    assert kv.block_table("b") == [3]
    assert kv.allocate_slots("a", 1, 6)  # position 6 still in block 2
    assert kv.block_table("a") == [1, 2]
    assert kv.allocate_slots("a", 2, 7)  # positions 7, 8: needs block index 2
    assert kv.block_table("a") == [1, 2, 4]
    assert kv.slot_mapping("a", 7, 2) == [2 * 4 + 3, 4 * 4 + 0]
    assert kv.num_tokens("a") == 9
    assert pool.free_block_ids() == [5, 6, 7, 8, 9]
    kv.free("a")  # last block first, as vLLM
    assert pool.free_block_ids() == [5, 6, 7, 8, 9, 4, 2, 1]
    assert "a" not in kv and "b" in kv
    kv.free("a")  # unknown: no-op
    kv.free("b")
    assert pool.num_free == 9


def test_does_not_fit_changes_nothing():
    pool, kv = make(4, 4)  # 3 usable blocks
    assert kv.allocate_slots("a", 8, 0)
    assert not kv.allocate_slots("b", 5, 0)  # needs 2, 1 free
    assert "b" not in kv and pool.free_block_ids() == [3]
    assert not kv.allocate_slots("a", 5, 8)
    assert kv.block_table("a") == [1, 2] and kv.num_tokens("a") == 8
    assert kv.num_blocks_needed("a", 5, 8) == 2
    assert kv.num_blocks_needed("a", 4, 8) == 1


def test_fork_shares_blocks_and_copy_on_write():
    pool, kv = make(10, 4)
    assert kv.allocate_slots("p", 6, 0)  # [1, 2], block 2 half full
    kv.fork("p", "c")
    assert kv.block_table("c") == [1, 2]
    assert pool.ref_count(1) == 2 and pool.ref_count(2) == 2
    # The child writes position 6 into the shared, partially filled block 2: copy-on-write.
    assert kv.allocate_slots("c", 1, 6)
    assert kv.block_table("c") == [1, 3]
    assert kv.take_pending_copies() == [(2, 3)]
    assert kv.take_pending_copies() == []
    assert pool.ref_count(1) == 2 and pool.ref_count(2) == 1 and pool.ref_count(3) == 1
    # The parent now owns block 2 alone: it appends in place.
    assert kv.allocate_slots("p", 1, 6)
    assert kv.block_table("p") == [1, 2] and kv.take_pending_copies() == []
    kv.free("p")
    assert pool.ref_count(1) == 1  # the child still reads the shared prefix
    kv.free("c")
    assert pool.num_free == 9


def test_copy_on_write_when_parent_writes_first_and_at_block_boundary():
    pool, kv = make(10, 4)
    assert kv.allocate_slots("p", 5, 0)  # [1, 2]
    kv.fork("p", "c")
    assert kv.allocate_slots("p", 1, 5)  # parent writes first: it gets the copy
    assert kv.block_table("p") == [1, 3] and kv.take_pending_copies() == [(2, 3)]
    assert kv.allocate_slots("c", 1, 5)  # block 2 is now the child's alone
    assert kv.block_table("c") == [1, 2] and kv.take_pending_copies() == []
    # Fork at a block boundary: the next token opens a fresh block, nothing to copy.
    assert kv.allocate_slots("q", 8, 0)  # [4, 5]
    kv.fork("q", "d")
    assert kv.allocate_slots("d", 1, 8)
    assert kv.block_table("d") == [4, 5, 6] and kv.take_pending_copies() == []
    # Copy-on-write counts against the pool: no free block, no write into a shared block.
    pool2, kv2 = make(3, 4)  # 2 usable
    assert kv2.allocate_slots("p", 6, 0)
    kv2.fork("p", "c")
    assert not kv2.allocate_slots("c", 1, 6)
    assert kv2.block_table("c") == [1, 2] and kv2.take_pending_copies() == []


def test_sliding_window_releases_blocks_outside_the_window():
    # block_size 4, W 6: a query at position p sees keys p-5 .. p.
    pool, kv = make(16, 4, sliding_window=6)
    assert kv.allocate_slots("s", 20, 0)  # prefill: every query of the chunk needs its keys
    assert kv.block_table("s") == [1, 2, 3, 4, 5]
    # Decode of position 20: keys j <= 14 are dead; blocks 0..2 end at 3, 7, 11 (<= 14) and
    # are released; block 3 (12..15) still holds keys 15; position 20 opens logical block 5.
    assert kv.allocate_slots("s", 1, 20)
    assert kv.block_table("s") == [0, 0, 0, 4, 5, 6]
    assert pool.free_block_ids() == [7, 8, 9, 10, 11, 12, 13, 14, 15, 1, 2, 3]
    assert kv.slot_mapping("s", 15, 6) == [4 * 4 + 3, 20, 21, 22, 23, 24]
    with pytest.raises(AssertionError, match="released"):
        kv.slot_mapping("s", 11, 1)
    # Position 21: keys <= 15 dead -> block 3 (id 4) goes.
    assert kv.allocate_slots("s", 1, 21)
    assert kv.block_table("s") == [0, 0, 0, 0, 5, 6]
    # Memory stays bounded by the window, not the length.
    for c in range(22, 200):
        assert kv.allocate_slots("s", 1, c)
        assert pool.num_used <= cdiv(6, 4) + 1
        table = kv.block_table("s")
        assert all(table[p // 4] != 0 for p in range(c - 5, c + 1))  # the window is intact
    assert len(kv.block_table("s")) == 50
    assert kv.max_live_blocks(10_000, 1) == 3
    kv.free("s")
    assert pool.num_free == 15


def test_sliding_window_chunked_prefill_and_release_counts_as_free():
    pool, kv = make(16, 4, sliding_window=6)
    assert kv.allocate_slots("s", 8, 0)
    assert kv.allocate_slots("s", 8, 8)  # c=8: keys <= 2 dead, block 0 (0..3) not yet
    assert kv.block_table("s") == [1, 2, 3, 4]
    assert kv.allocate_slots("s", 8, 16)  # c=16: keys <= 10 dead -> blocks 0, 1
    assert kv.block_table("s") == [0, 0, 3, 4, 5, 6]
    # A full pool still fits when the window frees enough.
    pool, kv = make(4, 4, sliding_window=4)  # 3 usable
    assert kv.allocate_slots("s", 12, 0)
    assert pool.num_free == 0
    assert kv.allocate_slots("s", 1, 12)  # keys <= 8 dead -> blocks 0, 1 released first
    assert kv.block_table("s") == [0, 0, 3, 1]
    # ...but not when another sequence holds the memory: nothing changes.
    pool, kv = make(4, 4, sliding_window=8)
    assert kv.allocate_slots("a", 8, 0) and kv.allocate_slots("b", 4, 0)
    assert not kv.allocate_slots("a", 1, 8)
    assert kv.block_table("a") == [1, 2] and pool.num_free == 0


def test_max_live_blocks():
    _, kv = make(10, 16)
    assert kv.max_live_blocks(100, 64) == 7
    _, kvw = make(10, 16, sliding_window=32)
    assert kvw.max_live_blocks(100, 1) == cdiv(32, 16) + 1
    assert kvw.max_live_blocks(100, 64) == min(7, cdiv(64 + 31, 16) + 1)
    assert kvw.max_live_blocks(10, 64) == 1


def test_bad_settings():
    with pytest.raises(TrtpipeError, match="block_size = 0"):
        KVCacheManager(BlockPool(4), 0)
    with pytest.raises(TrtpipeError, match="sliding_window = -1"):
        KVCacheManager(BlockPool(4), 4, -1)


# ---- property: random allocate/append/fork/free against a simulated KV store ------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["new", "append", "fork", "free"]), st.integers(0, 10**6), st.integers(1, 12)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, window=st.sampled_from([0, 3, 6]), block_size=st.sampled_from([1, 2, 4]))
def test_random_ops_keep_ref_counts_and_contents(ops, window, block_size):
    num_blocks = 24
    pool, kv = make(num_blocks, block_size, window)
    tokens: dict[int, list[int]] = {}  # what each sequence wrote, by position
    last_computed: dict[int, int] = {}
    store: dict[int, int] = {}  # slot -> value (the "KV pool")
    next_id = 0
    for op, pick, n in ops:
        live = sorted(tokens)
        if op == "new" or not live:
            seq, next_id = next_id, next_id + 1
            if kv.allocate_slots(seq, n, 0):
                tokens[seq], last_computed[seq] = [], 0
                _write(kv, store, tokens, seq, 0, n, pick)
            else:
                assert seq not in kv
            continue
        seq = live[pick % len(live)]
        if op == "append":
            c = len(tokens[seq])
            before = (kv.block_table(seq), pool.free_block_ids())
            if kv.allocate_slots(seq, n, c):
                last_computed[seq] = c
                _write(kv, store, tokens, seq, c, n, pick)
            else:
                assert (kv.block_table(seq), pool.free_block_ids()) == before
        elif op == "fork":
            child, next_id = next_id, next_id + 1
            kv.fork(seq, child)
            tokens[child], last_computed[child] = list(tokens[seq]), last_computed[seq]
        else:
            kv.free(seq)
            del tokens[seq], last_computed[seq]
        _check(pool, kv, store, tokens, last_computed, window, block_size)
    for seq in list(tokens):
        kv.free(seq)
    assert pool.num_free == num_blocks - 1


def _write(kv, store, tokens, seq, start, n, salt):
    bs = kv.block_size
    for src, dst in kv.take_pending_copies():  # the engine copies before writing
        for o in range(bs):
            if src * bs + o in store:
                store[dst * bs + o] = store[src * bs + o]
    values = [hash((seq, p, salt)) for p in range(start, start + n)]
    for slot, value in zip(kv.slot_mapping(seq, start, n), values):
        store[slot] = value
    tokens[seq].extend(values)


def _check(pool, kv, store, tokens, last_computed, window, block_size):
    owners: dict[int, int] = {}
    for seq in tokens:
        for b in kv.block_table(seq):
            if b:
                owners[b] = owners.get(b, 0) + 1
    for b in range(1, pool.num_blocks):
        assert pool.ref_count(b) == owners.get(b, 0)
    assert set(pool.free_block_ids()) == set(range(1, pool.num_blocks)) - set(owners)
    # Every key a future query can still see reads back what this sequence wrote.
    for seq, toks in tokens.items():
        lo = max(0, last_computed[seq] - window + 1) if window else 0
        if toks:
            for p, slot in zip(range(lo, len(toks)), kv.slot_mapping(seq, lo, len(toks) - lo)):
                assert store[slot] == toks[p]
