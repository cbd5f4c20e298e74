"""Admission that protects TTFT: predict how long a request arriving now waits before its own
prefill starts, so a server can answer 503 + ``Retry-After`` instead of queueing it into an
unbounded TTFT.

TTFT counts the queue. A request waits for two things, whichever ends later::

    prefill ahead   the uncomputed prompt tokens of every request before it (prefilling, waiting,
                    in the channel), run in chunks of the policy's size beside the current decodes:
                      prefill_s = ceil(tokens / chunk) x step_time(chunk, decodes)
    a batch row     with the batch full (running + waiting ahead >= max_batch_size), the j-th row
                    to free: the j-th smallest number of tokens the running requests still decode,
                    x the decode step (a request that ignores EOS: exactly its max_new_tokens left;
                    one that may stop at EOS: the median output length of recently finished
                    requests, capped by what it may still emit; none finished yet: not counted):
                      row_s = remaining_sorted[j] x decode_step   (j past the running: whole
                      rounds of the longest remaining)
    wait_s = max(prefill_s, row_s) x the policy's host factor (the host's speed now)

The engine thread takes a :class:`LoadSnapshot` after every step (:func:`snapshot_of`); the HTTP
side adds what is still in the channel and calls :func:`predicted_wait_s`. Prefix-cache hits of
waiting requests are looked up at snapshot time (a shared system prompt is not counted as work);
a request that may stop at EOS is expected to stop where recent ones did. Follows the load-shedding rule of Orca/DistServe-style SLO serving: refuse what would miss
anyway rather than let it delay everyone behind it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trtpipe.runtime.sched.request import Request, RequestStatus
from trtpipe.runtime.sched.step_cost import StepCostModel

MAX_CACHE_LOOKUPS = 16  # waiting requests whose cached prefix a snapshot looks up (the rest: none)


@dataclass(frozen=True)
class LoadSnapshot:
    """The scheduler's load after a step (engine thread -> HTTP side; immutable, so a plain
    attribute swap publishes it)."""

    prefill_tokens: int  # uncomputed, uncached prompt tokens of prefilling and waiting requests
    num_waiting: int  # requests not running yet (waiting or preempted)
    num_decoding: int  # running requests in their decode phase
    decode_context_sum: int  # tokens in the KV of the decoding requests
    remaining_decode_tokens: tuple[int, ...]  # per running request, ascending: tokens it may still emit


EMPTY = LoadSnapshot(0, 0, 0, 0, ())


def expected_remaining(r: Request, typical_output_tokens: int | None) -> int:
    """Tokens ``r`` is expected still to emit (module doc: a batch row)."""
    left = max(0, r.sampling_params.max_new_tokens - len(r.output_token_ids))
    if r.sampling_params.ignore_eos:
        return left
    if typical_output_tokens is None:
        return 0
    return min(left, max(1, typical_output_tokens - len(r.output_token_ids)))


def snapshot_of(
    requests: Iterable[Request], prefix_cache: Any = None, block_size: int = 1, typical_output_tokens: int | None = None
) -> LoadSnapshot:
    """The load of the unfinished ``requests`` (engine thread). ``prefix_cache``: a
    :class:`~trtpipe.runtime.kv.prefix_cache.PrefixCache` to discount the cached prefixes of the
    first ``MAX_CACHE_LOOKUPS`` waiting requests (None: no discount). ``typical_output_tokens``:
    the median output length of recently finished requests (None: none yet)."""
    prefill = waiting = decoding = context = lookups = 0
    remaining = []
    for r in requests:
        if r.is_finished:
            continue
        if r.status is RequestStatus.RUNNING:
            remaining.append(expected_remaining(r, typical_output_tokens))
            if r.is_prefilling:
                prefill += r.num_prefill_tokens - r.num_computed_tokens
            else:
                decoding += 1
                context += r.num_computed_tokens + 1
            continue
        waiting += 1
        cached = 0
        if prefix_cache is not None and lookups < MAX_CACHE_LOOKUPS:
            lookups += 1
            cached = len(prefix_cache.cached_prefix(r.all_token_ids, r.block_hashes, r.cache_salt)) * block_size
        prefill += r.num_tokens - cached
    return LoadSnapshot(prefill, waiting, decoding, context, tuple(sorted(remaining)))


def predicted_wait_s(
    load: LoadSnapshot,
    cost: StepCostModel,
    policy: Any,
    *,
    max_num_tokens: int,
    max_batch_size: int,
    extra_prefill_tokens: int = 0,
    extra_waiting: int = 0,
) -> float:
    """Seconds until the prefill of a request arriving now can start (module doc). ``policy``: the
    scheduler's chunk policy (its ``max_prefill_tokens`` and ``host_factor``), None for FCFS chunks
    of ``max_num_tokens``. ``extra_*``: requests submitted but not yet seen by the engine thread."""
    d, ctx = load.num_decoding, load.decode_context_sum
    factor = float(getattr(policy, "host_factor", 1.0))
    tokens = load.prefill_tokens + extra_prefill_tokens
    prefill_s = 0.0
    if tokens > 0:
        chunk = max_num_tokens if policy is None else policy.max_prefill_tokens(d, ctx)
        chunk = max(1, min(chunk, max_num_tokens))
        prefill_s = math.ceil(tokens / chunk) * cost.step_time_s([(chunk, 0)], d, ctx)
    row_s = 0.0
    ahead = len(load.remaining_decode_tokens) + load.num_waiting + extra_waiting
    if ahead >= max_batch_size and load.remaining_decode_tokens:
        rem = load.remaining_decode_tokens
        j = ahead - max_batch_size
        rounds, index = divmod(j, len(rem))
        decode_step_s = cost.decode_time_s(max(1, d), max(ctx, d))
        row_s = (rem[index] + rounds * rem[-1]) * decode_step_s
    return factor * max(prefill_s, row_s)


__all__ = ["EMPTY", "LoadSnapshot", "MAX_CACHE_LOOKUPS", "expected_remaining", "predicted_wait_s", "snapshot_of"]
