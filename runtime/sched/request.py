"""A generation request: its sampling parameters and its per-request state machine.

Follows vLLM v1 ``Request`` / ``RequestStatus`` / ``SamplingParams`` (reduced). Token ids and
text are kept apart: a request only holds token ids; text comes from the detokenizer.

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
import math
import numbers
import time
from dataclasses import dataclass, field

from trtpipe.runtime.errors import RequestError


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


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token and when to stop. Validated by :meth:`validate`.

    temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 are off. ``seed`` seeds the
    request's own generator (reproducible sampling). ``stop`` strings are matched on the text by
    the layer that owns the detokenizer; ``stop_token_ids`` and EOS are checked by the scheduler.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Accept lists for convenience but store tuples, so the record stays immutable/hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Raise :class:`RequestError` naming the field, the value, the expectation and a fix.

        Returns ``self`` so it can be chained.
        """

        def bad(name: str, expected: str, fix: str) -> RequestError:
            value = getattr(self, name)
            return RequestError(f"SamplingParams.{name} = {value!r}: expected {expected}; fix: {fix}")

        if not _is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise bad("max_new_tokens", "an int > 0", "pass e.g. max_new_tokens=128")
        if not _is_real(self.temperature) or not (0 <= self.temperature < math.inf):
            raise bad("temperature", "a finite float >= 0 (0 = greedy)", "pass 0.0 (greedy) or e.g. 0.7")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "an int >= 0 (0 = off)", "pass top_k=0 (off) or e.g. top_k=50")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", "a float in (0, 1] (1.0 = off)", "pass top_p=1.0 (off) or e.g. 0.9")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise bad("seed", "None or an int >= 0", "pass seed=None (random) or e.g. seed=0")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "a tuple of non-empty strings", 'pass e.g. stop=("\\n\\n",) or ()')
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a tuple of token ids (ints >= 0)", "pass e.g. (2,) or ()")
        return self


def require_bools(**flags: object) -> None:
    """Raise :class:`RequestError` naming the first flag that is not a bool ("no", "false", 0 and
    None are refused, never read as truthy or falsy)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(f"{name} = {value!r}: expected True or False. Fix: pass {name}=True or False.")


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


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


__all__ = ["SamplingParams", "Request", "RequestStatus"]
