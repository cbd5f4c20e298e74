"""A generation request: the one place a request is checked (:func:`new_request`) and its
per-request state machine.

Follows vLLM v1 ``Request`` / ``RequestStatus`` (reduced). Token ids and text are kept apart: a
request only holds token ids; text comes from the detokenizer. Every request the scheduler sees
was made by :func:`new_request` (``LLM.add_request`` and the server both go through it), so the
layers below trust it and check only what only they can know (the scheduler: a unique id, and
whether the KV pool could ever hold it).

State machine (``RequestStatus``)::

    WAITING --admit--> RUNNING --EOS / stop token--> FINISHED_STOPPED
       ^                  |  \\--max_new_tokens / max_seq_len--> FINISHED_LENGTH
       |               preempt  \\--abort / disconnect--> FINISHED_ABORTED
    PREEMPTED <-----------+     \\--never fits / engine error--> FINISHED_ERROR

A preempted request keeps its output tokens; on readmission its prompt plus outputs are
prefilled again ("recompute") and generation continues.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.params import SamplingParams


def prompt_length_error(num_prompt_tokens: int, max_seq_len: int) -> str | None:
    """Why a prompt of ``num_prompt_tokens`` cannot run under ``max_seq_len``, or None.

    The one prompt-length rule of the runtime (the scheduler, :class:`~trtpipe.runtime.llm.LLM`
    and the HTTP server apply it). ``max_seq_len`` bounds prompt + output and every request
    produces at least one token, so the prompt must be *shorter* than ``max_seq_len``: a prompt of
    exactly ``max_seq_len`` tokens leaves no room and is refused.
    """
    if num_prompt_tokens < max_seq_len:
        return None
    return (
        f"prompt has {num_prompt_tokens} tokens; expected fewer than max_seq_len = {max_seq_len} "
        "(prompt + output, at least one output token). Fix: shorten the prompt or build a recipe "
        "with a larger max_seq_len."
    )


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """OpenAI-style reason: "stop", "length", "abort", "error"; None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(eq=False)
class Request:
    """One sequence being generated. Mutated only by the scheduler.

    ``num_computed_tokens`` counts tokens whose KV is in the pool. ``num_prefill_tokens`` is the
    number of tokens the current admission prefills (the prompt, or prompt + outputs after a
    preemption); while ``num_computed_tokens < num_prefill_tokens`` the request is prefilling,
    afterwards it decodes one token per step.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time_s: float = field(default_factory=time.monotonic)  # monotonic clock, seconds
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    error_message: str | None = None  # why, when finish_reason == "error"
    num_prefill_tokens: int = 0
    num_preemptions: int = 0
    # Prefix caching: a per-request salt (only requests with the same salt share cached KV),
    # the chained hashes of the full blocks of all_token_ids (filled by the scheduler), and the
    # prompt tokens the first admission found in the cache (None until admitted; the OpenAI
    # ``usage.prompt_tokens_details.cached_tokens``).
    cache_salt: str | None = None
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_tokens: int | None = None
    # Wall time [s] from the first output token to the latest, as the client sees it (set by
    # whoever times the tokens, e.g. LLM; 0.0 otherwise): the slo policy's TPOT so far.
    itl_sum_s: float = 0.0
    # Structured output: the request's llguidance matcher (None: unconstrained), made off the
    # engine thread by LLM.new_request; advanced by the step runner with every sampled token.
    grammar: Any = None
    # n > 1: the first choice, whose prefill this choice waits for and whose prompt KV it then
    # shares (fork + copy-on-write, or the prefix cache where the engine cannot copy blocks).
    share_prefix_with: str | None = None

    def __post_init__(self) -> None:
        self.prompt_token_ids = tuple(int(t) for t in self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + tuple(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prefill_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def finish(self, status: RequestStatus, error_message: str | None = None) -> None:
        assert status.is_finished, status
        self.status = status
        self.finish_reason = status.finish_reason
        self.error_message = error_message


def new_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    max_seq_len: int,
    vocab_size: int,
    arrival_time_s: float | None = None,
    cache_salt: str | None = None,
) -> Request:
    """A new WAITING request, after every check a request gets (the one place they happen).

    Raises :class:`RequestError` (its ``field`` names what is wrong: ``prompt``,
    ``cache_salt`` or the sampling field) for bad sampling parameters, an empty prompt, token ids
    outside ``[0, vocab_size)`` (prompt, ``logit_bias``, ``stop_token_ids``), a prompt that leaves no room for an output token
    (:func:`prompt_length_error`), or a salt that is not a string.
    """
    params.validate()
    ids = tuple(int(t) for t in prompt_token_ids)
    if not ids:
        raise RequestError("prompt_token_ids is empty. Fix: send a non-empty prompt.", field="prompt")
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = next(t for t in ids if t < 0 or t >= vocab_size)
        raise RequestError(
            f"prompt token id {bad}: expected ids in [0, {vocab_size}) (this model's vocabulary). "
            "Fix: send ids from this model's tokenizer.",
            field="prompt",
        )
    for name, tokens in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids)):
        outside = [t for t in tokens if t >= vocab_size]
        if outside:
            raise RequestError(
                f"{name}: token id {outside[0]}: expected ids in [0, {vocab_size}) (this model's vocabulary). "
                "Fix: use ids from this model's tokenizer (POST /tokenize).",
                field=name,
            )
    too_long = prompt_length_error(len(ids), max_seq_len)
    if too_long is not None:
        raise RequestError(too_long, field="prompt", code="context_length_exceeded")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise RequestError(
            f"cache_salt = {cache_salt!r}: expected a string or None. Fix: pass e.g. a tenant id.", field="cache_salt"
        )
    arrival = time.monotonic() if arrival_time_s is None else arrival_time_s
    return Request(request_id, ids, params, arrival_time_s=arrival, cache_salt=cache_salt)


__all__ = ["Request", "RequestStatus", "new_request", "prompt_length_error"]
