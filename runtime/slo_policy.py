"""SLO-aware prefill chunk sizing: keep every step that decodes within the TPOT budget.

Follows Sarathi-Serve (Agrawal et al., OSDI 2024, "stall-free batching"): a step carries every
running decode plus as many prefill tokens as fit a *token budget* derived from the
time-between-tokens target. Here the budget comes from a measured :class:`StepCostModel` of the
built engine instead of a profiled constant, and it is recomputed every step from what that
step decodes::

    chunk      = the most tokens n (a multiple of block_size) with
                 cost.step_time_s([(n, prefill_context)], num_decodes, decode_context_sum)
                 <= tpot_budget        (two engine calls, or one where the engine fuses them)
    chunk      = max(chunk, block_size)          never below one block: prefill always advances
    no decodes -> chunk = max_num_tokens         nobody's ITL is at stake; TTFT wants big chunks

A decode token's ITL is the wall time of the step that computed it, so with every step's
predicted time under the budget, TPOT and ITL stay under it up to the model's error (when the
decodes alone exceed it, the step carries one block of prefill and the budget cannot hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.errors import TrtpipeError
from trtpipe.runtime.step_cost import StepCostModel


@dataclass(frozen=True)
class SloChunkPolicy:
    """Prefill tokens allowed in one step under ``tpot_budget_ms``.

    Raises :class:`TrtpipeError` for a budget <= 0 or sizes < 1.
    """

    cost: StepCostModel
    tpot_budget_ms: float
    block_size: int
    max_num_tokens: int

    def __post_init__(self) -> None:
        if not self.tpot_budget_ms > 0:
            raise TrtpipeError(
                f"tpot_budget_ms = {self.tpot_budget_ms!r}: expected > 0 ms; fix: set a "
                "TPOT budget (e.g. tpot_ms: {p95: 50}) or use scheduler.policy: fcfs"
            )
        if self.block_size < 1 or self.max_num_tokens < 1:
            raise TrtpipeError(
                f"block_size = {self.block_size}, max_num_tokens = {self.max_num_tokens}: expected both >= 1"
            )

    def max_prefill_tokens(self, num_decodes: int, decode_context_sum: int, prefill_context: int = 0) -> int:
        """Prefill tokens for a step that decodes ``num_decodes`` sequences (see module doc)."""
        bs = self.block_size
        room = self.max_num_tokens - num_decodes  # the step budget also carries the decodes
        if num_decodes == 0:
            return self.max_num_tokens
        budget_s = self.tpot_budget_ms / 1e3
        lo, hi = 0, max(0, room) // bs  # search the number of whole blocks
        while lo < hi:  # step time grows with n: the largest k with time(k*bs) <= budget
            mid = (lo + hi + 1) // 2
            if self.cost.step_time_s([(mid * bs, prefill_context)], num_decodes, decode_context_sum) <= budget_s:
                lo = mid
            else:
                hi = mid - 1
        return max(bs, lo * bs)

    def describe(self, max_batch_size: int, context_per_seq: int = 256) -> str:
        """One line for reports: the chunk chosen per decode batch size, and the costs behind it."""
        c = self.cost
        batches = sorted({b for b in (1, 2, 4, 8, max_batch_size) if b <= max_batch_size})
        chunks = ", ".join(f"{b} -> {self.max_prefill_tokens(b, b * context_per_seq)}" for b in batches)
        return (
            f"slo: TPOT budget {self.tpot_budget_ms:g} ms; measured step cost: prefill "
            f"{c.prefill_s[0] * 1e3:.1f} ms + {c.prefill_s[1] * 1e3:.3f} ms/token, decode "
            f"{c.decode_s[0] * 1e3:.1f} ms + {c.decode_s[1] * 1e3:.2f} ms/sequence"
            f"{', one call per mixed step' if c.fused else ''} (model error "
            f"{c.error_ms:.1f} ms, {c.rel_error:.0%}); prefill chunk by decode batch at "
            f"{context_per_seq} tokens of context: {chunks} tokens (never below one block = "
            f"{self.block_size}); no decode running: {self.max_num_tokens} tokens"
        )


__all__ = ["SloChunkPolicy"]
