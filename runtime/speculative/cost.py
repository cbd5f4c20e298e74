"""The measured cost of a speculative verify step against a plain decode step, taken at load.

A verify of k proposed tokens is one prefill-path chunk of k + 1 tokens (the last accepted token
and the proposal) with logits at every position. Decode is memory-bound: a chunk of a few tokens
reads the weights once, like a decode step, so it costs little more (measured on the 2-core Zen 4
host with the native engine at context 64: 2 tokens 1.06x a decode step, 3 tokens 1.20x, 5 tokens
1.74x, 8 tokens 2.21x). That ratio decides whether speculation pays, and it differs per host,
engine and thread count, so it is measured when the runtime loads (not kept in the artifact)::

    decode_s        one decode call, batch 1, context CONTEXT                 (the baseline)
    chunk_s[n - 1]  one prefill call: a chunk of n tokens after CONTEXT,
                    logits at all n positions, n = 1 .. max_k + 1, and 2 (max_k + 1)

``step_s(T)``, a step that computes T tokens in one call (decode rows and verify chunks alike:
their GEMMs see T rows), interpolates the table and extends it linearly past its end; with an
engine that does not fuse decode rows into the prefill call (``fused`` False) the plain decode
rows are a decode call of their own (``step_s_split``). Each call is timed ``repeats`` times and
the fastest kept (noise only adds time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.kv.planning import cdiv

if TYPE_CHECKING:
    from trtpipe.runtime.engines.base import Engine
    from trtpipe.runtime.kv.block_pool import BlockPool

CONTEXT = 64  # tokens of context of the timed calls (the precondition's setting)
REPEATS = 7


@dataclass(frozen=True)
class VerifyCost:
    """Seconds of the timed calls (module docstring); ``chunk_s[n - 1]`` for n tokens."""

    decode_s: float
    chunk_s: tuple[float, ...]
    fused: bool = True

    def chunk_time_s(self, n: int) -> float:
        """Predicted seconds of one call computing ``n`` >= 1 tokens (interpolated, then linear)."""
        table = self.chunk_s
        if n <= len(table):
            return table[max(n, 1) - 1]
        slope = (table[-1] - table[len(table) // 2 - 1]) / (len(table) - len(table) // 2)
        return table[-1] + max(slope, 0.0) * (n - len(table))

    def step_s(self, num_plain: int, num_verify_tokens: int) -> float:
        """Predicted seconds of a step with ``num_plain`` plain decode rows and verify chunks of
        ``num_verify_tokens`` tokens in all (fused: one call; else a decode call + a prefill call)."""
        if num_verify_tokens == 0:
            return self.decode_s if num_plain <= 1 else self.chunk_time_s(num_plain)
        if self.fused:
            return self.chunk_time_s(num_plain + num_verify_tokens)
        plain = 0.0 if num_plain == 0 else (self.decode_s if num_plain == 1 else self.chunk_time_s(num_plain))
        return plain + self.chunk_time_s(num_verify_tokens)

    def ratios(self) -> str:
        """One line: each chunk's cost over a decode step."""
        return ", ".join(f"{n}: {s / self.decode_s:.2f}x" for n, s in enumerate(self.chunk_s, 1))


def measure(
    engine: Engine, block_pool: BlockPool, block_size: int, max_k: int, *, fused: bool, repeats: int = REPEATS
) -> VerifyCost:
    """Time the calls of the module docstring on ``engine`` (dummy KV in blocks allocated from
    ``block_pool`` and given back after). Raises :class:`TrtpipeError` when the pool has too few
    free blocks. About (max_k + 3) x ``repeats`` engine calls: ~0.3 s on the Zen 4 host."""
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill
    from trtpipe.runtime.sched.step_cost import fastest_s

    sizes = list(range(1, max_k + 2)) + [2 * (max_k + 1)]
    need = cdiv(CONTEXT + sizes[-1], block_size)
    ids = block_pool.allocate(need)
    if ids is None:
        raise TrtpipeError(
            f"measuring the speculative verify cost needs {need} free KV blocks, the pool has "
            f"{block_pool.num_free}; fix: enable speculation before requests arrive, or give the pool more blocks"
        )
    table = tuple(ids)

    def slots(start: int, n: int) -> tuple[int, ...]:
        return tuple(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))

    try:
        ctx = PrefillBatch.from_scheduled([ScheduledPrefill("c", (1,) * CONTEXT, 0, table, slots(0, CONTEXT), True)])
        engine.prefill(ctx)  # the context's KV, and a warm-up
        dec = DecodeBatch.from_scheduled([ScheduledDecode("c", 1, CONTEXT, table, slots(CONTEXT, 1)[0])])
        decode_s = fastest_s(engine.decode, dec, repeats)
        chunk = {}
        for n in sizes:
            p = ScheduledPrefill("c", (1,) * n, CONTEXT, table, slots(CONTEXT, n), True)
            chunk[n] = fastest_s(engine.prefill, PrefillBatch.from_scheduled([p], all_logits=("c",)), repeats)
    finally:
        block_pool.free(ids)
    dense = [chunk[n] for n in sizes[:-1]]
    # the far point enters the table by linear interpolation from the last measured size
    last, far = sizes[-2], sizes[-1]
    dense += [chunk[last] + (chunk[far] - chunk[last]) * (n - last) / (far - last) for n in range(last + 1, far + 1)]
    # more tokens never cost less: a busy host's noise can make a 2-token call time under a 1-token
    # one (measured at load average 9 on 2 cores: 0.41x); the running maximum keeps the table sane
    return VerifyCost(decode_s=decode_s, chunk_s=tuple(float(x) for x in np.maximum.accumulate(dense)), fused=fused)


__all__ = ["CONTEXT", "VerifyCost", "measure"]
