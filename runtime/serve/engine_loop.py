"""The engine thread: the only owner of the ``LLM``; the asyncio side talks to it through a channel.

::

    asyncio (HTTP handlers)                        engine thread (owns LLM, KV pool, scheduler)
    ───────────────────────                        ─────────────────────────────────────────────
    submit(request, sink)     ──► commands ──────► drain commands: LLM.submit / cancel
    cancel(request_id)        ──►  (queue.Queue)   expire timeouts (cancel, finish "timeout")
                                                   llm.step()   (never while the event loop waits)
    sink(event)  ◄── loop.call_soon_threadsafe ◄── per served request: new text + ids -> Delta,
                                                   finished -> Final (blocks already free)

HTTP handlers only read the ``LLM``'s tokenizer and manifest (immutable after load); its
scheduler, KV pool and engines belong to the engine thread, which never awaits anything. A cancel
(client disconnect, timeout, shutdown) is applied before the next step, and ``LLM.cancel`` frees
the request's KV blocks at once; a request whose add and cancel arrive in the same batch, or that
still waits for admission, never runs. Text pieces come from the incremental detokenizer (``on_text``), so every piece is
whole characters; token ids travel separately.
"""

from __future__ import annotations

import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trtpipe.runtime.llm import LLM, RequestOutput
from trtpipe.runtime.sample.logprobs import TokenLogprobs
from trtpipe.runtime.sched.queue_wait import EMPTY, LoadSnapshot, predicted_wait_s, snapshot_of
from trtpipe.runtime.sched.request import Request
from trtpipe.runtime.serve.errors import EngineBusy
from trtpipe.runtime.serve.first_token_path import EngineStamps

log = logging.getLogger("trtpipe.serve")

MAX_FAILED_STEPS_IN_A_ROW = 3  # then the loop stops: /health turns 503, every request fails


@dataclass(frozen=True)
class Delta:
    """New output of one request since the last event: text (whole characters), token ids and,
    when the request asked logprobs, one record per new token."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None  # on the first delta, if asked
    stamps: EngineStamps | None = None  # on the first delta with token ids: the engine's timing


@dataclass(frozen=True)
class Final:
    """The request ended; ``output`` carries its finish reason, ids, text and metrics."""

    output: RequestOutput


@dataclass
class _Served:
    request_id: str
    sink: Callable[[Any], None]  # thread-safe: posts an event to the request's asyncio queue
    deadline_s: float | None
    taken_s: float  # left the channel (monotonic seconds)
    pieces: list[str] = field(default_factory=list)  # text from on_text, not yet sent
    num_ids_sent: int = 0


class EngineLoop:
    """Runs ``llm`` in a daemon thread until :meth:`shutdown`.

    Args:
        llm: the loaded runtime; used from the engine thread only after :meth:`start`.
        max_queued_requests: most requests waiting for admission (not yet running); past it
            :meth:`submit` raises :class:`EngineBusy` ("queue_full").
        request_timeout_s: a request still unfinished this long after arrival is cancelled and
            ends with finish reason "timeout" (None: no limit).
        on_finished: called in the engine thread with every finished :class:`RequestOutput`
            (Prometheus metrics).
        max_queue_wait_s: refuse a request ("overloaded", 503 + ``Retry-After``) when the wait
            before its prefill, predicted from the step-cost model
            (:mod:`trtpipe.runtime.sched.queue_wait`), exceeds this; None: no such limit (or no
            step-cost model).
    """

    def __init__(
        self,
        llm: LLM,
        *,
        max_queued_requests: int,
        request_timeout_s: float | None = None,
        on_finished: Callable[[RequestOutput], None] | None = None,
        max_queue_wait_s: float | None = None,
    ) -> None:
        self.llm = llm
        self.max_queue_wait_s = max_queue_wait_s
        self.load: LoadSnapshot = EMPTY  # published by the engine thread after every step
        self._output_lengths: deque[int] = deque(maxlen=64)  # of requests that stopped or hit their length
        self.max_queued_requests = max_queued_requests
        self.request_timeout_s = request_timeout_s
        self._on_finished = on_finished or (lambda out: None)
        self._commands: queue.Queue = queue.Queue()
        # submitted minus taken from the queue = requests still in the channel; each counter is
        # written by one thread only, so no lock is needed
        self._num_submitted = 0
        self._num_taken = 0
        self._tokens_submitted = 0  # prompt tokens, same rule
        self._tokens_taken = 0
        self._served: dict[str, _Served] = {}
        self._admitting = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trtpipe-engine", daemon=True)
        self.error: BaseException | None = None  # set when the loop died

    # -- asyncio side (any thread) ---------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def num_waiting(self) -> int:
        return self._num_submitted - self._num_taken + self.llm.scheduler.num_waiting

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def submit(self, request: Request, sink: Callable[[Any], None]) -> str:
        """Queue a request made by ``LLM.new_request`` (checked there, on the caller's thread);
        returns its id. Events (:class:`Delta`, then one :class:`Final`) go to ``sink`` from the
        engine thread. Raises :class:`EngineBusy` when it cannot be admitted."""
        if not self._admitting:
            raise EngineBusy("shutting_down", "the server is shutting down and admits no new requests")
        if not self.alive:
            raise EngineBusy("engine_dead", f"the engine loop stopped ({self.error!r}); restart the server")
        if self.num_waiting >= self.max_queued_requests:
            raise EngineBusy(
                "queue_full",
                f"{self.num_waiting} requests are already waiting (--max-queued-requests {self.max_queued_requests})",
            )
        wait_s = self.predicted_wait_s()
        if self.max_queue_wait_s is not None and wait_s > self.max_queue_wait_s:
            raise EngineBusy(
                "overloaded",
                f"the work ahead of this request is predicted to take {wait_s * 1e3:.0f} ms before its prefill "
                f"starts (--max-queue-wait-ms {self.max_queue_wait_s * 1e3:g})",
                retry_after_s=math.ceil(wait_s - self.max_queue_wait_s),
            )
        self._num_submitted += 1
        self._tokens_submitted += len(request.prompt_token_ids)
        self._commands.put(("add", request, sink))
        return request.request_id

    def predicted_wait_s(self) -> float:
        """Seconds a request arriving now is predicted to wait before its prefill starts
        (:func:`~trtpipe.runtime.sched.queue_wait.predicted_wait_s` of the last step's load plus the
        requests still in the channel); 0.0 without a step-cost model."""
        cost = self.llm.step_cost
        if cost is None:
            return 0.0
        limits = self.llm.manifest.limits
        return predicted_wait_s(
            self.load,
            cost,
            self.llm.scheduler.chunk_policy,
            max_num_tokens=limits.max_num_tokens,
            max_batch_size=limits.max_batch_size,
            extra_prefill_tokens=self._tokens_submitted - self._tokens_taken,
            extra_waiting=self._num_submitted - self._num_taken,
        )

    def cancel(self, request_id: str) -> None:
        """Abort a request (client gone): applied before the next step; KV freed at once."""
        self._commands.put(("cancel", request_id))

    def shutdown(self, grace_s: float) -> None:
        """Stop admitting, let running requests finish for up to ``grace_s``, cancel the rest, and
        stop the thread (blocks until it has)."""
        self._admitting = False
        self._commands.put(("drain", time.monotonic() + grace_s))
        self._thread.join(timeout=grace_s + 30.0)

    # -- engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        drain_deadline: float | None = None
        failures = 0
        try:
            while True:
                block = not self.llm.has_unfinished() and drain_deadline is None
                for cmd in self._take_commands(block):
                    if cmd[0] == "add":
                        self._add(*cmd[1:])
                    elif cmd[0] == "cancel":
                        self._cancel(cmd[1], "abort")
                    elif cmd[0] == "drain":
                        drain_deadline = cmd[1]
                now = time.monotonic()
                if drain_deadline is not None and (now >= drain_deadline or not self.llm.has_unfinished()):
                    for rid in list(self._served):
                        self._cancel(rid, "abort")
                    return
                self._expire(now)
                self._publish_load()
                if self.llm.has_unfinished():
                    try:
                        finished = self.llm.step()
                        self._publish(finished, time.monotonic())
                        self._publish_load()
                        failures = 0
                    except Exception as e:  # noqa: BLE001 - the step's requests fail, the others go on
                        failures += 1
                        log.exception("engine step failed (%d in a row)", failures)
                        if failures >= MAX_FAILED_STEPS_IN_A_ROW:
                            raise
                        self._fail_step(e)
        except BaseException as e:  # the loop is dead: fail every request so no client hangs
            log.exception("engine loop died")
            self.error = e
            for rid in list(self._served):
                self._cancel(rid, "error", str(e))

    def _publish_load(self) -> None:
        """The scheduler's load for :meth:`predicted_wait_s` (only when a limit asks for it)."""
        if self.max_queue_wait_s is not None:
            sched = self.llm.scheduler
            typical = int(statistics.median(self._output_lengths)) if self._output_lengths else None
            self.load = snapshot_of(
                self.llm.unfinished_requests(), sched.prefix_cache, sched.kv_manager.block_size, typical
            )

    def _fail_step(self, e: Exception) -> None:
        """After a failed step: ``LLM.step`` already finished that step's requests (KV freed); end
        their streams with finish reason "error"."""
        for rid in list(self._served):
            if self.llm.scheduler.get_request(rid) is None:
                self._cancel(rid, "error", f"engine step failed: {e}")

    def _take_commands(self, block: bool) -> list[tuple]:
        """Everything in the channel, in order. An add and the cancel that follows it in the same
        batch are both applied before the next step, so that request never runs."""
        cmds = []
        try:
            cmds.append(self._commands.get(timeout=0.5) if block else self._commands.get_nowait())
            while True:
                cmds.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        return cmds

    def _add(self, request: Request, sink: Callable) -> None:
        self._num_taken += 1
        self._tokens_taken += len(request.prompt_token_ids)
        rid, timeout = request.request_id, self.request_timeout_s
        deadline_s = None if timeout is None else request.arrival_time_s + timeout
        served = _Served(rid, sink, deadline_s, taken_s=time.monotonic())
        try:
            self.llm.submit(request, on_text=served.pieces.append)
        except Exception as e:  # checked upstream; a refusal here still answers the client
            sink(
                Final(
                    RequestOutput(
                        rid, request.prompt_token_ids, finished=True, finish_reason="error", error_message=str(e)
                    )
                )
            )
            return
        self._served[rid] = served

    def _cancel(self, rid: str, reason: str, error: str | None = None) -> None:
        served = self._served.pop(rid, None)
        if served is None:
            return
        out = self.llm.partial_output(rid)
        self.llm.cancel(rid)  # frees the KV blocks now
        if out is None:  # finished by the scheduler at add (never fits) and not yet reported
            out = RequestOutput(rid, (), finished=True)
        out.finish_reason = reason
        out.error_message = error or out.error_message
        self._send_new(served, out)
        self._finish(served, out)

    def _expire(self, now: float) -> None:
        for rid, served in list(self._served.items()):
            if served.deadline_s is not None and now >= served.deadline_s:
                self._cancel(rid, "timeout")

    def _publish(self, finished: list[RequestOutput], step_end_s: float) -> None:
        done = {out.request_id: out for out in finished}
        for rid, served in list(self._served.items()):
            out = done.get(rid) or self.llm.partial_output(rid)
            if out is None:
                continue
            self._send_new(served, out, step_end_s)
            if rid in done:
                del self._served[rid]
                self._finish(served, out)

    def _send_new(self, served: _Served, out: RequestOutput, step_end_s: float | None = None) -> None:
        ids = tuple(out.output_token_ids[served.num_ids_sent :])
        # a character cut by max_tokens / abort never reaches here as U+FFFD: the detokenizer's
        # flush drops its incomplete bytes (the ids still carry them)
        text = "".join(served.pieces)
        if ids or text:
            lps = None if out.logprobs is None else tuple(out.logprobs[served.num_ids_sent :])
            first = served.num_ids_sent == 0 and out.prompt_logprobs is not None
            plps = tuple(out.prompt_logprobs or ()) if first else None
            stamps = None
            if served.num_ids_sent == 0 and ids and step_end_s is not None:
                stamps = EngineStamps(served.taken_s, step_end_s, time.monotonic())
            served.pieces.clear()
            served.num_ids_sent += len(ids)
            served.sink(Delta(text, ids, lps, plps, stamps))

    def _finish(self, served: _Served, out: RequestOutput) -> None:
        if out.finish_reason in ("stop", "length"):
            self._output_lengths.append(len(out.output_token_ids))
        # metrics first: a client that scrapes /metrics right after its last chunk finds its request
        try:
            self._on_finished(out)
        except Exception:  # metrics must never take the engine down
            log.exception("on_finished failed")
        served.sink(Final(out))


__all__ = ["EngineLoop", "Delta", "Final"]
