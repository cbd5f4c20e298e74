"""Warm an engine before it is announced ready: every shape class it will serve, the KV pool's
pages, and one request end to end.

A server that says "ready" after loading runs its first requests cold: weight pages still on
disk, scratch buffers and thread pools not yet grown, the chat template not compiled, the
sampler's and detokenizer's first calls. Issue 27 measured the first 30 requests after "ready" at
4.4x the warm TTFT. :func:`warm_up` runs, before ``/health`` answers 200::

    KV pool        every page written once (fill 0): memory fixed from the first request on
    decode         one call per batch size 1..max_batch_size
    prefill        one call per chunk size the scheduler picks (the policy's chunk for each decode
                   batch size, one block, and max_num_tokens alone), as fused mixed calls beside
                   that many decodes where the engine fuses them
    one request    a chat request through the whole runtime path (template, tokenizer, scheduler,
                   sampler, detokenizer), 8 output tokens
    garbage        collected, and what survives start-up frozen (gc.freeze, as vLLM's server does):
                   later full collections skip the ~65k start-up objects (40 ms each here)

Dummy calls write KV only into blocks taken from the pool for the purpose and given back after
(as the step-cost calibration does); the request's blocks are freed when it finishes, and the
prefix-cache counters are reset, so ``/metrics`` starts at zero.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.planning import cdiv
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM

DECODE_CONTEXT_TOKENS = 32  # context of each decode row in the dummy calls
CHUNK_CONTEXT_TOKENS = 256  # context per decode row the policy's chunk sizes are asked at (its describe())
WARM_REQUEST = "Say hello."


@dataclass(frozen=True)
class WarmUpReport:
    """What :func:`warm_up` ran and how long it took [s]."""

    seconds: float
    decode_batches: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    pool_bytes: int

    def line(self) -> str:
        return (
            f"warmed up in {self.seconds:.1f} s (decode batches {self.decode_batches[0]}-{self.decode_batches[-1]}, "
            f"prefill chunks {', '.join(map(str, self.prefill_chunks))} tokens, "
            f"{self.pool_bytes / 2**20:.0f} MiB of KV pool touched, one request end to end)"
        )


def chunk_sizes(policy: Any, block_size: int, max_num_tokens: int, max_batch_size: int) -> tuple[int, ...]:
    """The prefill chunk sizes to warm: one block, ``max_num_tokens``, and ``policy``'s chunk
    beside one decode and beside a full batch (the ends of its range; None: FCFS, only the two).
    Sizes in between differ only in how many rows the same kernels run."""
    sizes = {min(block_size, max_num_tokens), max_num_tokens}
    if policy is not None:
        for b in {1, max_batch_size}:
            sizes.add(min(max_num_tokens - b, policy.max_prefill_tokens(b, b * CHUNK_CONTEXT_TOKENS)))
    return tuple(sorted(s for s in sizes if s > 0))


def warm_up(llm: LLM) -> WarmUpReport:
    """Warm ``llm`` (an idle :class:`~trtpipe.runtime.llm.LLM`: nothing submitted) as the module doc
    says. Raises :class:`TrtpipeError` when the pool has too few free blocks for the dummy calls."""
    t0 = time.perf_counter()
    pool_bytes = 0
    for array in llm.pool.arrays:  # K, V and an int8 pool's scales
        array.fill(0)
        pool_bytes += array.nbytes
    limits, bs = llm.manifest.limits, llm.kv_manager.block_size
    batches = tuple(range(1, limits.max_batch_size + 1))
    chunks = chunk_sizes(llm.scheduler.chunk_policy, bs, limits.max_num_tokens, limits.max_batch_size)
    _dummy_calls(llm, chunks, batches)
    _one_request(llm)
    gc.collect()
    gc.freeze()
    return WarmUpReport(round(time.perf_counter() - t0, 2), batches, chunks, pool_bytes)


def _dummy_calls(llm: LLM, chunks: tuple[int, ...], batches: tuple[int, ...]) -> None:
    """Decode calls at every batch size; prefill calls at every chunk size (fused beside decodes
    when the runtime fuses mixed steps). KV goes to blocks reserved here and freed after."""
    engine, bs = llm.engine, llm.kv_manager.block_size
    max_b = batches[-1]
    row0_blocks = cdiv(max(chunks) + 1, bs)
    dec_blocks = cdiv(DECODE_CONTEXT_TOKENS + 1, bs)
    ids = llm.block_pool.allocate(row0_blocks + dec_blocks * max_b)
    if ids is None:
        raise TrtpipeError(
            f"warm-up needs {row0_blocks + dec_blocks * max_b} free KV blocks, the pool has "
            f"{llm.block_pool.num_free}; fix: give the pool more blocks (kv_cache.num_blocks)"
        )
    row0 = tuple(ids[:row0_blocks])
    rows = [tuple(ids[row0_blocks + i * dec_blocks : row0_blocks + (i + 1) * dec_blocks]) for i in range(max_b)]

    def slots(table: tuple[int, ...], start: int, n: int) -> tuple[int, ...]:
        return tuple(table[p // bs] * bs + p % bs for p in range(start, start + n))

    def decodes(b: int) -> list[ScheduledDecode]:
        c = DECODE_CONTEXT_TOKENS
        return [ScheduledDecode(f"warm{i}", 1, c, rows[i], slots(rows[i], c, 1)[0]) for i in range(b)]

    try:
        for b in batches:
            engine.decode(DecodeBatch.from_scheduled(decodes(b)))
        for i, n in enumerate(chunks):
            chunk = ScheduledPrefill("warm", (1,) * n, 0, row0, slots(row0, 0, n), True)
            beside = decodes(min(max_b, 1 + i % max_b)) if llm.fuse_mixed_steps else []
            engine.prefill(PrefillBatch.from_scheduled([chunk, *(d.as_prefill_chunk() for d in beside)]))
    finally:
        llm.block_pool.free(ids)


def _one_request(llm: LLM) -> None:
    """One short chat request through the runtime (greedy, 8 tokens); counters reset after."""
    chat = llm.manifest.model.chat_template is not None
    llm.add_request(WARM_REQUEST, SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True), chat=chat)
    llm.run_until_done()
    llm.reset_traffic_counters()


__all__ = ["WarmUpReport", "chunk_sizes", "warm_up"]
