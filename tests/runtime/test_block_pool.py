"""BlockPool: exact block ids, free-queue order, ref counts, misuse."""

import pytest

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.block_pool import NULL_BLOCK_ID, BlockPool


def test_null_block_is_never_handed_out():
    pool = BlockPool(4)
    assert pool.num_free == 3 and pool.num_used == 0
    assert pool.free_block_ids() == [1, 2, 3]
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.allocate(1) is None
    assert NULL_BLOCK_ID == 0


def test_allocate_free_exact_ids_and_queue_order():
    pool = BlockPool(8)  # usable 1..7
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.allocate(2) == [4, 5]
    pool.free([3, 1])  # tail order follows the call order
    assert pool.free_block_ids() == [6, 7, 3, 1]
    assert pool.num_free == 4 and pool.num_used == 3
    assert pool.allocate(3) == [6, 7, 3]
    assert pool.free_block_ids() == [1]
    pool.free([5, 4, 2])
    assert pool.free_block_ids() == [1, 5, 4, 2]
    assert pool.allocate(0) == []


def test_allocate_none_means_nothing_changed():
    pool = BlockPool(5)
    assert pool.allocate(2) == [1, 2]
    assert pool.allocate(3) is None  # only 2 free: no partial allocation
    assert pool.free_block_ids() == [3, 4]
    assert pool.num_used == 2


def test_ref_counts_share_and_release():
    pool = BlockPool(6)
    ids = pool.allocate(2)
    pool.incref(ids)
    pool.incref([ids[0]])
    assert [pool.ref_count(b) for b in ids] == [3, 2]
    pool.free(ids)
    assert pool.num_free == 3  # still owned
    pool.free(ids)
    assert pool.free_block_ids() == [3, 4, 5, 2]  # block 2 reached 0 first
    pool.free([1])
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]
    assert pool.ref_count(1) == 0


def test_misuse_is_an_assertion():
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(AssertionError, match="double free"):
        pool.free([b])
    with pytest.raises(AssertionError):
        pool.free([NULL_BLOCK_ID])
    with pytest.raises(AssertionError):
        pool.incref([b])  # free block
    with pytest.raises(AssertionError):
        pool.allocate(-1)


def test_too_small_pool_is_a_user_error():
    with pytest.raises(TrtpipeError, match="num_blocks = 1"):
        BlockPool(1)


def test_check_all_free_raises_kv_leak_error_naming_the_count():
    from trtpipe.runtime.errors import KVLeakError

    pool = BlockPool(5)
    pool.check_all_free(after="nothing")  # all 4 free: no error
    ids = pool.allocate(2)
    with pytest.raises(KVLeakError, match=r"2 of 4 KV blocks are still in use after the correctness check"):
        pool.check_all_free(after="the correctness check")
    pool.free(ids)
    pool.check_all_free(after="freeing")
