"""Admission rules the scheduler applies to one request: whether it could ever fit the KV pool
(:func:`never_fits`), how large its prefill chunks may be (:func:`chunk_cap`: one token at a time
for prompt logprobs), and which waiting choices of ``n`` > 1 join their first choice by forking
its prompt KV instead of prefilling (:func:`forkable_choices`).

Parallel sampling (vLLM's ``n``), one prompt prefilled once::

    choice 0 ──prefill prompt (blocks b0 b1 b2*)──► logits of the last prompt token
                                                    ├─ sample choice 0's first token (its rng)
    choices 1..n-1 (waiting, never ran) ──fork─────┴─ sample choice i's first token (its rng)
        block table [b0 b1 b2*], ref counts +1      (* the partial last block)
    next decode: the first writer of b2* gets a fresh block + a queued copy of b2* (copy-on-write,
    KVCacheManager.take_pending_copies; the engine copies before the step), full blocks stay shared

So n choices hold ``full prompt blocks + n partial blocks`` instead of ``n x`` the prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.sched.request import Request, RequestStatus


def never_fits(request: Request, kv: KVCacheManager, max_num_tokens: int, max_seq_len: int) -> str | None:
    """Why ``request`` can never run (its KV would not fit the whole pool), or None. Prevents
    waiting forever for the impossible."""
    num_prompt = len(request.prompt_token_ids)
    # KV is written for every token but the last sampled one; generation stops at
    # max_new_tokens outputs or max_seq_len tokens (after the first output at least).
    max_new = request.sampling_params.max_new_tokens
    num_kv_tokens = max(num_prompt, min(num_prompt + max_new - 1, max_seq_len - 1))
    num_blocks = kv.max_live_blocks(num_kv_tokens, max_num_tokens)
    num_usable = kv.block_pool.num_blocks - 1
    if num_blocks > num_usable:
        return (
            f"request needs up to {num_blocks} KV blocks ({num_kv_tokens} tokens) but the "
            f"pool has {num_usable}; fix: lower max_new_tokens, shorten the prompt, or give "
            "the KV pool more blocks"
        )
    return None


def forkable_choices(parent: Request, context_len: int, waiting: Iterable[Request], room: int) -> list[Request]:
    """The waiting choices that may fork ``parent`` once its chunk ending at ``context_len`` is
    computed, at most ``room`` (free batch rows).

    ``parent`` must be running, completing its whole prompt with this chunk and without output
    yet (its first admission, not a recompute); a choice must share its prompt
    (``share_prefix_with``), be WAITING and never have run, so the prompt KV is exactly its own.
    """
    if parent.status is not RequestStatus.RUNNING or parent.output_token_ids or room <= 0:
        return []
    if context_len != len(parent.prompt_token_ids):
        return []
    out = [
        r
        for r in waiting
        if r.share_prefix_with == parent.request_id
        and r.status is RequestStatus.WAITING
        and not r.output_token_ids
        and r.num_preemptions == 0
        and r.prompt_token_ids == parent.prompt_token_ids
    ]
    return out[:room]


def chunk_cap(request: Request) -> int:
    """Most tokens one prefill chunk of ``request`` may hold: 1 while a request that asked
    ``prompt_logprobs`` computes its prompt (the prefill graph returns the last token's logits
    only, so each prompt token gets its own chunk and logits row; other requests' prefill is
    unchanged), else no cap."""
    if request.sampling_params.prompt_logprobs is not None and request.num_computed_tokens < len(
        request.prompt_token_ids
    ):
        return 1
    return 1 << 30


def waits_for_sibling(request: Request, unfinished: Mapping[str, Request]) -> bool:
    """True while the choice whose prompt KV ``request`` shares (n > 1) has not finished its
    prefill (then there is nothing to fork or to find in the prefix cache yet)."""
    sibling = unfinished.get(request.share_prefix_with or "")
    return sibling is not None and (sibling.status is not RequestStatus.RUNNING or sibling.is_prefilling)


def fork_choice(kv: KVCacheManager, parent: Request, child: Request) -> None:
    """``child`` shares ``parent``'s prompt blocks (ref counts +1; copy-on-write when written) and
    runs from now, its prompt computed (the caller moves it from waiting to running)."""
    kv.fork(parent.request_id, child.request_id)
    child.status = RequestStatus.RUNNING
    child.num_computed_tokens = child.num_prefill_tokens = parent.num_computed_tokens
    child.num_cached_tokens = parent.num_cached_tokens
    child.block_hashes = list(parent.block_hashes)


__all__ = ["chunk_cap", "fork_choice", "forkable_choices", "never_fits", "waits_for_sibling"]
