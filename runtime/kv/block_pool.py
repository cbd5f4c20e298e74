"""The KV block pool: which physical KV blocks are free, and how many owners each used block has.

Follows vLLM v1 ``BlockPool`` (``vllm/v1/core/block_pool.py``), prefix caching included:

* Block ids index the block axis of every layer's K/V cache ``[kv_heads, num_blocks, block_size, head_dim]``.
* Block 0 is the *null block*: never handed out, so a block table can use 0 for "no block here"
  (padding, or a sliding-window block that was released) and the attention op still reads a
  valid address, which the mask then ignores.
* Free blocks wait in a FIFO queue. ``allocate`` pops from the head, ``free`` appends to the tail
  when a block's reference count drops to zero, so block ids are handed out in a predictable
  order (tests assert exact ids).
* Reference counts let several sequences share a block (``KVCacheManager.fork``, a prefix-cache
  hit); a block is free exactly when its count is 0.
* Prefix cache: a full block may carry a hash (:mod:`trtpipe.runtime.kv.prefix_cache`). A cached
  block whose count drops to 0 keeps its KV and its hash and joins the free queue like any other
  block, so the queue is also the LRU list of cached blocks: ``touch`` takes a hit block out of
  the queue wherever it is (count 0 -> 1), and ``allocate`` evicts (forgets the hash of) a
  cached block only when it pops it from the head to hand it out. A block with a count > 0 is
  never in the queue, so a referenced cached block is never handed out.

Free queue and cache (ids)::

    head (allocated / evicted first) -> [6, 7, 3*, 1*] <- tail (freed last)     * = has a hash
    cached: {h(3): 3, h(1): 1, h(5): 5}    block 5 is cached and in use (count > 0)

The pool knows nothing about sequences or tokens; ``KVCacheManager`` does. Misuse of the pool
(freeing a free block, touching the null block) is a bug in trtpipe, so it raises
``AssertionError``; "does not fit" is an ordinary outcome and is the return value ``None``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from trtpipe.runtime.errors import KVLeakError, TrtpipeError

NULL_BLOCK_ID = 0


class BlockPool:
    """``num_blocks`` reference-counted KV blocks; ids ``1 .. num_blocks-1`` are allocatable.

    Raises :class:`TrtpipeError` when ``num_blocks < 2`` (there would be no usable block).
    """

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise TrtpipeError(
                f"num_blocks = {num_blocks!r}: expected an int >= 2 (block 0 is the reserved "
                "null block); fix: give the KV pool more memory or a smaller block size"
            )
        self.num_blocks = num_blocks
        # ref_counts[b] = number of owners of block b; 0 = in the free queue. Block 0 is pinned
        # at 1 so it can never be freed or handed out.
        self._ref_counts = [0] * num_blocks
        self._ref_counts[NULL_BLOCK_ID] = 1
        # Insertion-ordered: O(1) pop at the head, append at the tail, removal of a touched block.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._hash_of: dict[int, bytes] = {}  # block id -> block hash (cached blocks only)
        self._block_of: dict[bytes, int] = {}  # block hash -> block id (one block per hash)
        self.num_evictions = 0  # cached blocks whose hash was dropped to reuse the block

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks in the free queue."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Allocatable blocks that have at least one owner (the null block is not counted)."""
        return self.num_blocks - 1 - len(self._free)

    def check_all_free(self, after: str) -> None:
        """Raise :class:`KVLeakError` unless every allocatable block is free (or only cached).

        ``after`` names what just finished (e.g. "the correctness check") for the message.
        """
        if self.num_used:
            raise KVLeakError(
                f"{self.num_used} of {self.num_blocks - 1} KV blocks are still in use after {after}, "
                "with no request running: a KV leak (a bug in trtpipe). Fix: report it with the "
                "command that ran; `trtpipe validate` gates on this check."
            )

    def ref_count(self, block_id: int) -> int:
        """Number of owners of ``block_id`` (0 = free)."""
        assert 0 < block_id < self.num_blocks, f"block id {block_id} out of range"
        return self._ref_counts[block_id]

    def free_block_ids(self) -> list[int]:
        """Snapshot of the free queue, head (next to be allocated) first. For tests/debugging."""
        return list(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks that carry a hash (in use or on the free queue)."""
        return len(self._block_of)

    def cached_block(self, block_hash: bytes) -> int | None:
        """The block holding the KV named ``block_hash``, or None (never cached, or evicted)."""
        return self._block_of.get(block_hash)

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash of a cached block, None for an uncached one."""
        return self._hash_of.get(block_id)

    # -- updates -----------------------------------------------------------------------------

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks from the head of the free queue, each with ref count 1.

        Returns the ids in allocation order, or ``None`` (and changes nothing) when fewer than
        ``num_blocks`` are free: there is never a partial allocation.
        """
        assert num_blocks >= 0, f"cannot allocate {num_blocks} blocks"
        if num_blocks > len(self._free):
            return None
        ids = [self._free.popitem(last=False)[0] for _ in range(num_blocks)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
            block_hash = self._hash_of.pop(block_id, None)
            if block_hash is not None:  # evict: its KV is about to be overwritten
                del self._block_of[block_hash]
                self.num_evictions += 1
        return ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add one owner to each cached block (a prefix-cache hit), free or not.

        A block with count 0 leaves the free queue (wherever it is: LRU order) and keeps its KV.
        """
        for block_id in block_ids:
            assert block_id in self._hash_of, f"touch of uncached block {block_id}"
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all unreferenced cached blocks (vLLM's ``reset_prefix_cache``:
        e.g. between benchmark runs). Blocks in use keep theirs. Returns how many were dropped."""
        dropped = [b for b in self._hash_of if self._ref_counts[b] == 0]
        for block_id in dropped:
            del self._block_of[self._hash_of.pop(block_id)]
        return len(dropped)

    def cache_block(self, block_id: int, block_hash: bytes) -> bool:
        """Name a full, computed, owned block by ``block_hash`` so later requests can reuse it.

        Returns False (and changes nothing) when another block already holds that hash (two
        requests computed the same prefix at once; this block then stays uncached) or this block
        is already cached.
        """
        assert self._ref_counts[block_id] > 0, f"cache_block of free block {block_id}"
        if block_hash in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one owner to each used block (sharing, e.g. a forked prefix)."""
        for block_id in block_ids:
            assert 0 < block_id < self.num_blocks, f"block id {block_id} out of range"
            assert self._ref_counts[block_id] > 0, f"incref of free block {block_id}"
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one owner from each block; a block whose count reaches 0 goes to the queue tail.

        Blocks are processed in the given order, so the caller decides the free-queue order.
        Freeing a free block (double free) or the null block raises ``AssertionError``.
        """
        for block_id in block_ids:
            assert 0 < block_id < self.num_blocks, f"block id {block_id} out of range"
            assert self._ref_counts[block_id] > 0, f"double free of block {block_id}"
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None  # a cached block keeps its hash (LRU tail)


__all__ = ["BlockPool", "NULL_BLOCK_ID"]
