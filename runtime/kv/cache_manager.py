"""Per-sequence KV block lists on top of the :class:`BlockPool`: allocate, append, free, fork,
truncate (the rollback of rejected speculative tokens).

Follows vLLM v1 ``KVCacheManager`` / ``SingleTypeKVCacheManager`` (``allocate_slots`` returns
"does not fit" instead of raising; the sliding-window manager drops blocks that left the window;
``find_cached_prefix`` / ``cache_full_blocks`` for automatic prefix caching).

Block table and slots (one sequence, ``block_size`` = 4)::

    position     0 1 2 3 | 4 5 6 7 | 8 9
    logical blk  0       | 1       | 2
    block table  [7,       3,        9]          physical block ids
    slot(p)      = block_table[p // block_size] * block_size + p % block_size
    slot(5)      = 3*4 + 1 = 13

Sliding window (Hugging Face convention, see ``docs/contracts.md``): a query at position p sees
keys j with p - W < j <= p. When a step computes the tokens at positions ``c .. c+n-1`` (``c`` =
tokens already in the pool), its first query is at ``c``, so every key at ``j <= c - W`` is dead
for this and every later step. A logical block whose *last* position is ``<= c - W`` is released
at the start of that step and its table entry becomes ``0`` (the null block), so logical
indexing still works and the attention mask never reads it. A sequence therefore holds at most
``ceil((n + W - 1) / block_size) + 1`` blocks at once, however long it gets. One manager serves
one group of layers with the same window; a model mixing windows needs one manager per group.

Prefix caching: ``cache_full_blocks`` names every full block whose KV has been computed by its
chained hash (:mod:`trtpipe.runtime.kv.prefix_cache`); a new sequence starts with
``allocate_slots(..., cached_block_ids=find_cached_prefix(hashes))`` and shares those blocks
(ref counts +1), computing only the rest. Hit blocks are full and lie before the first position
the sequence computes, so nobody ever writes into a shared cached block.

Sliding window and the cache: a hit on blocks ``0 .. n-1`` requires *all n* to be cached
(the longest cached run from block 0), although with window W the new sequence only reads the
blocks that still overlap positions ``> n*bs - W``. The dead blocks of the hit are not even
referenced (their table entries are the null block at once, as if the window had released
them), so a hit is: "the chain of hashes proves the prefix is the same tokens under the same
artifact and salt, and the blocks the window still needs hold its KV". KV of a token depends on
every earlier token (through the layers below), which the chain covers, so the KV is what an
uncached run would compute. Blocks the window released stay cached (LRU) and may be evicted;
then the chain breaks there and the hit is shorter: correct, at worst a smaller saving.

Fork and copy-on-write: ``fork(parent, child)`` gives the child the parent's blocks (ref counts
+1). Whenever a sequence is about to write into a block that someone else also owns, it gets a
fresh block instead; if the shared block already holds some of this sequence's tokens, the
``(src, dst)`` copy the engine must do before the step is queued in ``take_pending_copies()``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.block_pool import NULL_BLOCK_ID, BlockPool
from trtpipe.runtime.kv.planning import cdiv


@dataclass(frozen=True)
class _AllocationPlan:
    """What ``allocate_slots`` would do: computed without touching anything."""

    release_indices: tuple[int, ...]  # logical blocks that left the sliding window
    cow_indices: tuple[int, ...]  # logical blocks shared with another sequence, to be written
    num_new_blocks: int  # blocks appended at the end of the table
    num_freed_by_release: int  # released blocks this sequence owned alone (back to the queue)

    @property
    def num_taken(self) -> int:
        """Blocks taken from the free queue."""
        return self.num_new_blocks + len(self.cow_indices)


class KVCacheManager:
    """Block tables of all sequences that hold KV in one pool.

    Args:
        block_pool: the shared pool (also reachable as ``self.block_pool``).
        block_size: tokens per block (from the recipe).
        sliding_window: W in tokens; 0 = full attention (no release).

    Sequence ids are any hashable (the scheduler uses request ids).
    """

    def __init__(self, block_pool: BlockPool, block_size: int, sliding_window: int = 0) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise TrtpipeError(
                f"block_size = {block_size!r}: expected an int >= 1; fix: set kv.block_size "
                "in the recipe (16 is a good default)"
            )
        if not isinstance(sliding_window, int) or sliding_window < 0:
            raise TrtpipeError(
                f"sliding_window = {sliding_window!r}: expected an int >= 0 (0 = off); "
                "fix: use the model's sliding_window or 0"
            )
        self.block_pool = block_pool
        self.block_size = block_size
        self.sliding_window = sliding_window
        self._blocks: dict[Hashable, list[int]] = {}
        self._num_tokens: dict[Hashable, int] = {}  # tokens with a slot (allocated length)
        self._num_hashed: dict[Hashable, int] = {}  # leading blocks already offered to the cache
        self._pending_copies: list[tuple[int, int]] = []

    # -- queries -----------------------------------------------------------------------------

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._blocks

    @property
    def num_seqs(self) -> int:
        return len(self._blocks)

    def seq_ids(self) -> list[Hashable]:
        return list(self._blocks)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens of ``seq_id`` that have a slot (0 for an unknown sequence)."""
        return self._num_tokens.get(seq_id, 0)

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Logical block i -> physical block id; released window blocks read 0 (null block)."""
        return list(self._blocks[seq_id])

    def slot_mapping(self, seq_id: Hashable, start_pos: int, num_tokens: int) -> list[int]:
        """Pool slots of positions ``start_pos .. start_pos+num_tokens-1`` (int, one per token).

        ``slot = block_id * block_size + position % block_size``. The positions must have been
        allocated by ``allocate_slots`` and not released by the window.
        """
        blocks = self._blocks[seq_id]
        bs = self.block_size
        assert 0 <= start_pos and start_pos + num_tokens <= self._num_tokens[seq_id], (
            f"positions {start_pos}..{start_pos + num_tokens - 1} of {seq_id!r} have no slot"
        )
        slots = []
        for pos in range(start_pos, start_pos + num_tokens):
            block_id = blocks[pos // bs]
            assert block_id != NULL_BLOCK_ID, f"position {pos} of {seq_id!r} was released"
            slots.append(block_id * bs + pos % bs)
        return slots

    def num_blocks_needed(self, seq_id: Hashable, num_new_tokens: int, num_computed_tokens: int) -> int:
        """Blocks ``allocate_slots`` with these arguments would take from the free queue.

        Counts new blocks and copy-on-write blocks; window releases are not subtracted (see
        ``allocate_slots`` for the exact fit test).
        """
        return self._plan(seq_id, num_new_tokens, num_computed_tokens).num_taken

    def max_live_blocks(self, num_tokens: int, max_chunk_tokens: int) -> int:
        """Upper bound on the blocks one sequence of ``num_tokens`` holds at once.

        Without a window this is ``ceil(num_tokens / block_size)``. With window W, computed in
        steps of at most ``max_chunk_tokens`` tokens, a step computing n tokens keeps positions
        ``c-W+1 .. c+n-1`` alive: ``n+W-1`` positions, spanning at most
        ``ceil((n+W-1)/block_size) + 1`` blocks. Used by the scheduler to reject a request that
        could never fit the pool, instead of waiting for it forever.
        """
        full = cdiv(num_tokens, self.block_size)
        if self.sliding_window == 0:
            return full
        windowed = cdiv(max_chunk_tokens + self.sliding_window - 1, self.block_size) + 1
        return min(full, windowed)

    # -- updates -----------------------------------------------------------------------------

    def find_cached_prefix(self, block_hashes: Sequence[bytes]) -> list[int]:
        """Block ids of the longest run of cached blocks named by ``block_hashes[0], [1], ...``.

        Changes nothing (the blocks are taken by ``allocate_slots(cached_block_ids=...)``).
        """
        hit: list[int] = []
        for block_hash in block_hashes:
            block_id = self.block_pool.cached_block(block_hash)
            if block_id is None:
                break
            hit.append(block_id)
        return hit

    def cache_full_blocks(self, seq_id: Hashable, block_hashes: Sequence[bytes], num_computed_tokens: int) -> None:
        """Name the full blocks of ``seq_id`` whose KV is computed (the first ``num_computed_tokens``).

        ``block_hashes[i]`` is the hash of logical block i (may be longer than needed). Call it
        after the engine wrote the KV (the scheduler does it in ``update``), never before: a
        cached block must hold its tokens' KV. A block already released by the window, or whose
        hash another block already holds, is skipped.
        """
        blocks = self._blocks.get(seq_id)
        if blocks is None:
            return
        start = self._num_hashed.get(seq_id, 0)
        end = min(num_computed_tokens // self.block_size, len(block_hashes), len(blocks))
        for i in range(start, end):
            if blocks[i] != NULL_BLOCK_ID:
                self.block_pool.cache_block(blocks[i], block_hashes[i])
        self._num_hashed[seq_id] = max(start, end)

    def allocate_slots(
        self, seq_id: Hashable, num_new_tokens: int, num_computed_tokens: int, cached_block_ids: Sequence[int] = ()
    ) -> bool:
        """Give ``seq_id`` slots for positions ``num_computed_tokens .. +num_new_tokens-1``.

        ``cached_block_ids`` (a new sequence only, from ``find_cached_prefix``): its first blocks
        are these cached blocks; then ``num_computed_tokens`` must be ``len(cached_block_ids) *
        block_size`` (their KV is computed already) and they count as free when they are.

        Before allocating, releases the window blocks that the step's first query (position
        ``num_computed_tokens``) can no longer see, and replaces blocks shared with another
        sequence that this step writes into (copy-on-write, see ``take_pending_copies``).

        Returns ``False`` and changes nothing when the pool cannot supply the blocks (the blocks
        the window would release count as available). An unknown ``seq_id`` starts empty.
        """
        assert num_new_tokens >= 0 and num_computed_tokens >= 0
        if cached_block_ids:
            return self._allocate_with_prefix(seq_id, num_new_tokens, num_computed_tokens, cached_block_ids)
        assert num_computed_tokens <= self._num_tokens.get(seq_id, 0), (
            f"{seq_id!r}: computed {num_computed_tokens} tokens but only {self._num_tokens.get(seq_id, 0)} have slots"
        )
        plan = self._plan(seq_id, num_new_tokens, num_computed_tokens)
        if plan.num_taken > self.block_pool.num_free + plan.num_freed_by_release:
            return False

        blocks = self._blocks.setdefault(seq_id, [])
        pool = self.block_pool
        # Oldest first, so the queue tail order follows position order.
        pool.free([blocks[i] for i in plan.release_indices])
        for i in plan.release_indices:
            blocks[i] = NULL_BLOCK_ID
        for i in plan.cow_indices:
            (new_id,) = pool.allocate(1)  # type: ignore[misc]  # fit checked above
            old_id = blocks[i]
            # Only the block holding the write position's predecessors carries data we need.
            if i == num_computed_tokens // self.block_size and num_computed_tokens % self.block_size:
                self._pending_copies.append((old_id, new_id))
            pool.free([old_id])  # drop our share; the other owners keep it
            blocks[i] = new_id
        new_ids = pool.allocate(plan.num_new_blocks)
        assert new_ids is not None
        blocks.extend(new_ids)
        self._num_tokens[seq_id] = max(self._num_tokens.get(seq_id, 0), num_computed_tokens + num_new_tokens)
        return True

    def free(self, seq_id: Hashable) -> None:
        """Return all blocks of ``seq_id`` at once (finish, abort, error, preemption).

        Blocks are freed last-first, as vLLM does, so the tail of a sequence is reused before its
        head. Freeing an unknown sequence is a no-op (e.g. a request that never got blocks).
        """
        blocks = self._blocks.pop(seq_id, None)
        self._num_tokens.pop(seq_id, None)
        self._num_hashed.pop(seq_id, None)
        if blocks:
            self.block_pool.free([b for b in reversed(blocks) if b != NULL_BLOCK_ID])

    def truncate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Roll the slots of ``seq_id`` back to its first ``num_tokens`` (speculative tokens the
        verifier rejected): blocks wholly past them are freed, last first (so the queue tail
        follows position order, as in ``free``); returns their ids. A partly kept block keeps its
        stale slots: they lie past the sequence's length, so attention never reads them, and the
        next tokens overwrite them before the block is full and can be cached (only computed,
        accepted tokens are ever hashed). Shrinking below the hashed blocks is a bug (asserted).
        """
        blocks = self._blocks[seq_id]
        assert 0 <= num_tokens <= self._num_tokens[seq_id], (seq_id, num_tokens, self._num_tokens[seq_id])
        keep = cdiv(num_tokens, self.block_size)
        assert self._num_hashed.get(seq_id, 0) <= keep, f"{seq_id!r}: truncate into cached blocks"
        dropped = blocks[keep:]
        del blocks[keep:]
        self.block_pool.free([b for b in reversed(dropped) if b != NULL_BLOCK_ID])
        self._num_tokens[seq_id] = num_tokens
        return dropped

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Make ``child_id`` share every block of ``parent_id`` (ref counts +1, no copy now).

        Call it between steps (when the parent's allocated slots hold computed KV). Writes into
        a shared block later go through copy-on-write in ``allocate_slots``.
        """
        assert parent_id in self._blocks, f"fork of unknown sequence {parent_id!r}"
        assert child_id not in self._blocks, f"fork into existing sequence {child_id!r}"
        blocks = list(self._blocks[parent_id])
        self.block_pool.incref(b for b in blocks if b != NULL_BLOCK_ID)
        self._blocks[child_id] = blocks
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._num_hashed[child_id] = self._num_hashed.get(parent_id, 0)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The ``(src_block_id, dst_block_id)`` copies queued by copy-on-write, then clears them.

        The engine copies every layer's K and V block ``src`` into ``dst`` before running the
        step whose slots were allocated.
        """
        copies, self._pending_copies = self._pending_copies, []
        return copies

    # -- internals ---------------------------------------------------------------------------

    def _allocate_with_prefix(
        self, seq_id: Hashable, num_new_tokens: int, num_computed_tokens: int, cached_block_ids: Sequence[int]
    ) -> bool:
        """``allocate_slots`` for a new sequence that starts with a prefix-cache hit."""
        bs = self.block_size
        assert seq_id not in self._blocks, f"prefix hit for existing sequence {seq_id!r}"
        assert num_computed_tokens == len(cached_block_ids) * bs, (
            f"{seq_id!r}: {len(cached_block_ids)} cached blocks but {num_computed_tokens} computed tokens"
        )
        pool = self.block_pool
        # Blocks the first query (position c) can no longer see are not referenced at all.
        num_dead = max(0, (num_computed_tokens - self.sliding_window + 1) // bs) if self.sliding_window else 0
        live = list(cached_block_ids[num_dead:])
        num_new_blocks = cdiv(num_computed_tokens + num_new_tokens, bs) - len(cached_block_ids)
        num_touched_free = sum(1 for b in live if pool.ref_count(b) == 0)
        if num_new_blocks + num_touched_free > pool.num_free:
            return False
        pool.touch(live)  # first, so the allocation below cannot evict a hit block
        new_ids = pool.allocate(num_new_blocks)
        assert new_ids is not None
        self._blocks[seq_id] = [NULL_BLOCK_ID] * num_dead + live + new_ids
        self._num_tokens[seq_id] = num_computed_tokens + num_new_tokens
        self._num_hashed[seq_id] = len(cached_block_ids)
        return True

    def _plan(self, seq_id: Hashable, num_new_tokens: int, num_computed_tokens: int) -> _AllocationPlan:
        blocks = self._blocks.get(seq_id, [])
        bs = self.block_size
        pool = self.block_pool
        end = num_computed_tokens + num_new_tokens
        release: list[int] = []
        if self.sliding_window > 0:
            # Logical block i ends at position (i+1)*bs - 1; dead iff that is <= c - W.
            num_dead = max(0, (num_computed_tokens - self.sliding_window + 1) // bs)
            release = [i for i in range(min(num_dead, len(blocks))) if blocks[i] != NULL_BLOCK_ID]
        cow = [
            i
            for i in range(num_computed_tokens // bs, min(len(blocks), cdiv(end, bs)))
            if num_new_tokens > 0 and blocks[i] != NULL_BLOCK_ID and pool.ref_count(blocks[i]) > 1
        ]
        return _AllocationPlan(
            release_indices=tuple(release),
            cow_indices=tuple(cow),
            num_new_blocks=max(0, cdiv(end, bs) - len(blocks)),
            num_freed_by_release=sum(1 for i in release if pool.ref_count(blocks[i]) == 1),
        )


__all__ = ["KVCacheManager"]
