"""One request's output: :class:`RequestOutput` (what callers get) and :class:`LiveRequest` (the
runtime's state for a request still running: detokenizer, timer, sampler RNG, streamed text).

:meth:`LiveRequest.append_text` holds back text that could still become a stop string until it
cannot (or the request ends), so a stop string never reaches the client (vLLM's stop-string
handling). Used by :class:`~trtpipe.runtime.llm.LLM`, which re-exports :class:`RequestOutput`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer, find_stop, stop_prefix_len
from trtpipe.runtime.metrics.request_metrics import RequestMetrics, RequestTimer
from trtpipe.runtime.sample.logprobs import TokenLogprobs
from trtpipe.runtime.sched.request import Request


@dataclass
class RequestOutput:
    """The result of one request: ids and text kept apart, finish reason, timings."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    error_message: str | None = None
    metrics: RequestMetrics | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)
    # one record per output token when the request asked ``logprobs`` (None otherwise)
    logprobs: list[TokenLogprobs] | None = None
    # one record per prompt token when the request asked ``prompt_logprobs`` (entry 0: None)
    prompt_logprobs: list[TokenLogprobs | None] | None = None


@dataclass
class LiveRequest:
    """A running request: its output (updated in place), detokenizer, timer and sampler RNG."""

    request: Request
    detok: IncrementalDetokenizer
    timer: RequestTimer
    rng: np.random.Generator | None
    output: RequestOutput
    on_text: Callable[[str], None] | None = None
    prefill_started: bool = False
    stopped: bool = False  # a stop string matched: no more text for this request
    emitted: int = 0  # characters of output.text already handed to on_text

    def append_text(self, piece: str, final: bool = False) -> bool:
        """Add detokenized text; stream what is safe. Returns True when a stop string matched.

        Text that could still become a stop string is held back until it cannot (or the request
        ends), so a stop string never reaches the client (vLLM's stop-string handling).
        """
        if self.stopped:
            return False
        stop = self.request.sampling_params.stop
        text = self.output.text + piece
        hit = (
            find_stop(text, stop, max(0, len(self.output.text) - max((len(s) for s in stop), default=0)))
            if stop
            else None
        )
        if hit is not None:
            text = text[:hit]
            self.stopped = final = True
        self.output.text = text
        safe = len(text) if final or not stop else len(text) - stop_prefix_len(text, stop)
        if self.on_text and safe > self.emitted:
            self.on_text(text[self.emitted : safe])
        self.emitted = max(self.emitted, safe)
        return hit is not None

    def finish(self, reason: str, error: str | None = None) -> None:
        """Close the output: finish reason, error message and the timer's metrics (monotonic clock)."""
        self.timer.finish(time.monotonic(), reason)
        self.output.finished = True
        self.output.finish_reason = reason
        self.output.error_message = error
        self.output.metrics = self.timer.metrics()
