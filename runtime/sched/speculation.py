"""The scheduler's side of speculative decoding: what a speculator must implement
(:class:`Speculator`, passed to the :class:`~trtpipe.runtime.sched.scheduler.Scheduler` at
construction; :class:`~trtpipe.runtime.speculative.speculator.NgramSpeculator` is the one built in),
which decoding requests verify proposed tokens this step (:func:`propose_drafts`) and whether a
verify row fits the KV pool (:func:`verify_tokens`).

Rules, each keeping the non-speculative scheduler's guarantees:

* only in a step without prompt work: no request is prefilling and none waits for a free batch
  row, so prefill chunk sizes (the slo policy's) and time to first token are untouched, and a
  step that speculates is a decode step whose extra tokens come out of the step's token budget
  (``max_num_tokens``, or the slo policy's decodes + cap), which bounds its time as before;
* a proposal never makes a request exceed ``max_new_tokens`` or ``max_seq_len`` (a verify of k
  tokens emits up to k + 1), so the KV a request can hold stays what ``never_fits`` admitted;
* a verify row never preempts anyone: it runs only when its blocks leave one free block for each
  decoding request behind it, else the request decodes one token as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trtpipe.runtime.metrics.spec_counters import SpeculationCounters
    from trtpipe.runtime.sched.request import Request


class Speculator(Protocol):
    """Proposals for the scheduler, outcomes from the step runner, totals for the metrics."""

    @property
    def counters(self) -> SpeculationCounters:
        """Totals since load (or since :meth:`reset_counters`)."""
        ...

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """request id -> proposed token ids (at most ``limits[i]`` for ``requests[i]``); only
        non-empty proposals are returned."""
        ...

    def on_verified(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        """A verify of ``num_proposed`` tokens kept the first ``num_accepted``."""
        ...

    def reset_counters(self) -> None:
        """Start the totals (and any learned acceptance prior) at 0: warm-up is not traffic."""
        ...


def speculates(request: Any) -> bool:
    """Whether ``request`` may verify proposed tokens: it did not opt out
    (``SamplingParams.speculative``) and has no structured output (its grammar matcher would have
    to be rolled back with every rejected token: not done, so those requests decode plainly)."""
    return bool(request.sampling_params.speculative) and request.grammar is None


def propose_drafts(
    speculator: Speculator,
    running: Sequence[Request],
    num_waiting: int,
    max_batch_size: int,
    budget: int,
    max_seq_len: int,
) -> dict[str, tuple[int, ...]]:
    """request id -> proposed tokens for this step (module doc); {} when the step has prompt work."""
    if any(r.is_prefilling for r in running) or (num_waiting and len(running) < max_batch_size):
        return {}
    eligible = [r for r in running if speculates(r)]
    if not eligible:
        return {}
    spare = budget - len(running)  # every running request decodes one token
    limits = [
        min(r.sampling_params.max_new_tokens - len(r.output_token_ids), max_seq_len - r.num_tokens) - 1
        for r in eligible
    ]
    props = speculator.propose(eligible, [max(0, min(n, spare)) for n in limits])
    out = {}
    for r in eligible:  # oldest first, within the step's token budget
        drafts = props.get(r.request_id, ())[: max(0, spare)]
        if drafts:
            out[r.request_id] = drafts
            spare -= len(drafts)
    return out


def verify_tokens(kv: Any, request: Any, drafts: dict[str, tuple[int, ...]], num_behind: int) -> int:
    """Tokens ``request`` computes this step: 1 + its proposal when those slots leave a block free
    for each of ``num_behind`` requests after it (a verify never preempts), else 1 (plain decode)."""
    num_tokens = 1 + len(drafts.get(request.request_id, ()))
    if num_tokens == 1:
        return 1
    need = kv.num_blocks_needed(request.request_id, num_tokens, request.num_computed_tokens)
    return num_tokens if need + num_behind <= kv.block_pool.num_free else 1


__all__ = ["Speculator", "propose_drafts", "speculates", "verify_tokens"]
