"""The step records of one running request (:mod:`trtpipe.runtime.sched.step`), built from its
state and its block table in the KV manager (the scheduler calls these once it allocated the
slots)."""

from __future__ import annotations

from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.sched.request import Request
from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill


def prefill_record(kv: KVCacheManager, request: Request, num_new: int) -> ScheduledPrefill:
    """The next ``num_new`` tokens of ``request``'s prefill (prompt, or prompt + outputs after a
    preemption), from ``num_computed_tokens`` on."""
    start = request.num_computed_tokens
    end = start + num_new
    prompt = request.prompt_token_ids
    token_ids = prompt[start:end] if end <= len(prompt) else request.all_token_ids[start:end]
    return ScheduledPrefill(
        request_id=request.request_id,
        token_ids=token_ids,
        start_position=start,
        block_table=tuple(kv.block_table(request.request_id)),
        slot_mapping=tuple(kv.slot_mapping(request.request_id, start, num_new)),
        is_last_chunk=end == request.num_prefill_tokens,
    )


def decode_record(kv: KVCacheManager, request: Request, drafts: tuple[int, ...] = ()) -> ScheduledDecode:
    """``request``'s decode of its last token, with ``drafts`` (proposed tokens) a verify row."""
    position, rid = request.num_computed_tokens, request.request_id
    slots = kv.slot_mapping(rid, position, 1 + len(drafts))
    block_table = tuple(kv.block_table(rid))
    return ScheduledDecode(rid, request.last_token_id, position, block_table, slots[0], drafts, tuple(slots[1:]))


__all__ = ["decode_record", "prefill_record"]
