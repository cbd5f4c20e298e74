"""The KV block pool: which physical KV blocks are free, and how many owners each used block has.

Follows vLLM v1 ``BlockPool`` (``vllm/v1/core/block_pool.py``), without prefix caching:

* Block ids index the first axis of every layer's K/V cache ``[num_blocks, block_size, ...]``.
* Block 0 is the *null block*: never handed out, so a block table can use 0 for "no block here"
  (padding, or a sliding-window block that was released) and the attention op still reads a
  valid address, which the mask then ignores.
* Free blocks wait in a FIFO queue. ``allocate`` pops from the head, ``free`` appends to the tail
  when a block's reference count drops to zero, so block ids are handed out in a predictable
  order (tests assert exact ids).
* Reference counts let several sequences share a block (``KVCacheManager.fork``); a block is free
  exactly when its count is 0.

The pool knows nothing about sequences or tokens; ``KVCacheManager`` does. Misuse of the pool
(freeing a free block, touching the null block) is a bug in trtpipe, so it raises
``AssertionError``; "does not fit" is an ordinary outcome and is the return value ``None``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from trtpipe.runtime.errors import TrtpipeError

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
        self._free: deque[int] = deque(range(1, num_blocks))

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks in the free queue."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Allocatable blocks that have at least one owner (the null block is not counted)."""
        return self.num_blocks - 1 - len(self._free)

    def ref_count(self, block_id: int) -> int:
        """Number of owners of ``block_id`` (0 = free)."""
        assert 0 < block_id < self.num_blocks, f"block id {block_id} out of range"
        return self._ref_counts[block_id]

    def free_block_ids(self) -> list[int]:
        """Snapshot of the free queue, head (next to be allocated) first. For tests/debugging."""
        return list(self._free)

    # -- updates -----------------------------------------------------------------------------

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks from the head of the free queue, each with ref count 1.

        Returns the ids in allocation order, or ``None`` (and changes nothing) when fewer than
        ``num_blocks`` are free: there is never a partial allocation.
        """
        assert num_blocks >= 0, f"cannot allocate {num_blocks} blocks"
        if num_blocks > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(num_blocks)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
        return ids

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
                self._free.append(block_id)


__all__ = ["BlockPool", "NULL_BLOCK_ID"]
