"""The scheduler's output records (what the prefill and decode engines run in one step) and the
chunk-policy interface it consults (implemented by :mod:`trtpipe.runtime.sched.slo_policy`).

Produced by :class:`~trtpipe.runtime.sched.scheduler.Scheduler.schedule`, consumed by
:mod:`trtpipe.runtime.sched.batch` (engine feeds), :class:`~trtpipe.runtime.llm.LLM` and the
calibration/teacher-forcing probes. Kept apart from the scheduler (vLLM v1's
``sched/output.py``) so the engines import records, not the scheduler. Frozen, plain ints and
tuples only (``docs/contracts.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ScheduledPrefill:
    """A chunk of one sequence's prompt for the prefill engine."""

    request_id: str
    token_ids: tuple[int, ...]  # [n] int token ids of the chunk
    start_position: int  # position of token_ids[0]; > 0 for a later chunk
    block_table: tuple[int, ...]  # [num_logical_blocks] physical block ids, 0 = null block
    slot_mapping: tuple[int, ...]  # [n] pool slot of each chunk token
    is_last_chunk: bool  # the logits of the last token are sampled only for the last chunk

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens of the sequence in the pool after this step (chunk included)."""
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class ScheduledDecode:
    """One token of one running sequence for the decode engine; with ``draft_token_ids`` a
    speculative *verify* row: the token and the k proposed ones after it run as one chunk through
    the prefill path, with logits at every position (:mod:`trtpipe.runtime.speculative`)."""

    request_id: str
    token_id: int  # the last sampled token, whose KV is written now
    position: int  # its position
    block_table: tuple[int, ...]  # [num_logical_blocks] physical block ids, 0 = null block
    slot: int  # pool slot where its K/V are written
    draft_token_ids: tuple[int, ...] = ()  # [k] proposed tokens verified after token_id (k = 0: plain)
    draft_slots: tuple[int, ...] = ()  # [k] their pool slots (rolled back where rejected)

    @property
    def num_tokens(self) -> int:
        return 1 + len(self.draft_token_ids)

    @property
    def context_len(self) -> int:
        return self.position + 1 + len(self.draft_token_ids)

    def as_prefill_chunk(self) -> ScheduledPrefill:
        """This token (and its proposed ones) as a last chunk, for a prefill call that also decodes
        (the prefill graph takes any number of tokens per sequence; a 1-token row's logits row is
        this token's, a verify row asks logits at every position: ``PrefillBatch.from_scheduled``)."""
        tokens = (self.token_id, *self.draft_token_ids)
        return ScheduledPrefill(
            self.request_id, tokens, self.position, self.block_table, (self.slot, *self.draft_slots), True
        )


@dataclass(frozen=True, slots=True)
class SchedulerStep:
    """What the engines run this step. ``preempted``: request ids whose KV was freed this step."""

    prefills: tuple[ScheduledPrefill, ...]
    decodes: tuple[ScheduledDecode, ...]
    preempted: tuple[str, ...]

    @property
    def num_tokens(self) -> int:
        return sum(p.num_tokens for p in self.prefills) + sum(d.num_tokens for d in self.decodes)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes


@dataclass(frozen=True, slots=True)
class DecodeProgress:
    """Where one decoding request stands against its TPOT budget, for a chunk policy.

    ``num_itl``: token gaps so far (output tokens - 1, >= 0); ``itl_sum_s``: their total wall
    time in seconds (first output token -> latest, as the client sees it); ``remaining_tokens``:
    the most tokens it may still produce, this step's included (>= 1: ``max_new_tokens`` or the
    sequence limit, whichever comes first; EOS may end it sooner).
    """

    num_itl: int
    itl_sum_s: float
    remaining_tokens: int

    @classmethod
    def of(cls, request: Any, max_seq_len: int) -> DecodeProgress:
        """The record of a decoding :class:`~trtpipe.runtime.sched.request.Request`."""
        produced = len(request.output_token_ids)
        allowed = min(request.sampling_params.max_new_tokens - produced, max_seq_len - request.num_tokens)
        return cls(num_itl=max(0, produced - 1), itl_sum_s=request.itl_sum_s, remaining_tokens=max(1, allowed))


class ChunkPolicy(Protocol):
    """Sizes a step's prefill (e.g. :class:`~trtpipe.runtime.sched.slo_policy.SloChunkPolicy`)."""

    def max_prefill_tokens(
        self,
        num_decodes: int,
        decode_context_sum: int,
        prefill_context: int = 0,
        progress: tuple[DecodeProgress, ...] = (),
        prefill_pending: bool = True,
    ) -> int:
        """Prefill tokens allowed in a step decoding ``num_decodes`` sequences (>= 1);
        ``progress``: one record per decoding sequence (may be empty); ``prefill_pending``: a
        prompt waits or prefills (else the tokens go to speculative drafts only)."""
        ...


__all__ = ["ChunkPolicy", "DecodeProgress", "ScheduledPrefill", "ScheduledDecode", "SchedulerStep"]
