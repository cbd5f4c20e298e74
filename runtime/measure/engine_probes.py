"""Engine-level probes behind validate's ``cancel_ms`` and ``itl_during_prefill_ratio`` budgets (as
onnxruntime-genai's engine benchmark sets them), run after a scenario's workload, in process
(an :class:`~trtpipe.runtime.serve.engine_loop.EngineLoop` over the LLM, as the server runs it) or
over HTTP (``validate --url``). One probe logic, two clients (:class:`ProbeClient`).

Cancel -> KV free, at saturation::

    start max_batch_size + 4 requests (long outputs): the batch is full, some wait
    NUM_CANCELS times: take a running request that has emitted tokens, cancel it (t0), wait for
        the engine to confirm its KV blocks are free (t1), start a replacement (still saturated)
    cancel_ms = t1 - t0 per cancel   (in process: the engine thread's Final event, sent after
        LLM.cancel freed the blocks; over HTTP: the client closes the stream, then polls /metrics
        until request_success_total{finished_reason="abort"} counts it, every ~5 ms)

ITL while another request prefills::

    one decoding request D (short prompt, DECODE_TOKENS outputs); after STEADY_TOKENS of its gaps,
    NUM_PARTNERS times: a partner with a long prompt and 1 output token (its prefill window =
    send -> first token), then STEADY_TOKENS more gaps of D
    during = D's gaps that overlap a partner's prefill window; steady = D's other gaps (its first
    2 excluded: they hold D's own prefill)
    ratio = p95(during) / p95(steady)

Times on the probe side's monotonic clock; gaps in ms.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

NUM_CANCELS = 8
CANCEL_OUTPUT_TOKENS = 512  # long enough that no probe request ends by itself
# The decoding request's budget, capped by max_seq_len (it is cancelled once the partners are done):
# it must outlive every partner's prefill, which an ITL-during-prefill ratio stretches to seconds
# (3 partners of 494 tokens beside it at ratio 1.5: 2-3 s each on a 2-core CPU, docs/server.md).
DECODE_TOKENS = 4096
STEADY_TOKENS = 24  # gaps after each partner (and before the first): enough for a steady p95
NUM_PARTNERS = 3
PROBE_TIMEOUT_S = 300.0


@dataclass
class Stream:
    """One probe request as its client sees it: token arrival times (monotonic seconds)."""

    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    done: bool = False


class ProbeClient(Protocol):
    """What a probe needs from the engine: start a request, cancel it (returning once its KV is
    confirmed free), and close."""

    async def start(self, prompt_ids: Sequence[int], max_tokens: int, cache_salt: str | None = None) -> Stream:
        """Send a request (``cache_salt``: a fresh one never hits the prefix cache)."""
        ...

    async def cancel(self, stream: Stream) -> float:
        """Cancel ``stream``; returns seconds from the cancel to its KV blocks freed."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ProbeResult:
    """What the probes measured [ms]: one entry per cancel; the decoding request's gaps; each
    partner's TTFT (send -> first token: the prefill window, what the decoder's pace costs it)."""

    cancel_ms: tuple[float, ...] = ()
    itl_steady_ms: tuple[float, ...] = ()
    itl_during_prefill_ms: tuple[float, ...] = ()
    partner_ttft_ms: tuple[float, ...] = ()


async def _wait(predicate, what: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine probe: {what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.002)


async def probe_cancel(
    client: ProbeClient, prompt_ids: Sequence[int], max_batch_size: int, max_tokens: int = CANCEL_OUTPUT_TOKENS
) -> tuple[float, ...]:
    """cancel -> free times [ms] at saturation (module doc)."""
    streams = [await client.start(prompt_ids, max_tokens) for _ in range(max_batch_size + 4)]
    out = []
    try:
        for _ in range(NUM_CANCELS):
            await _wait(lambda: any(len(s.token_times_s) >= 2 and not s.done for s in streams), "a decoding request")
            victim = next(s for s in streams if len(s.token_times_s) >= 2 and not s.done)
            out.append(await client.cancel(victim) * 1e3)
            streams.remove(victim)
            streams.append(await client.start(prompt_ids, max_tokens))
    finally:
        for s in streams:
            if not s.done:
                await client.cancel(s)
    return tuple(out)


def split_gaps(times_s: Sequence[float], windows: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """``(steady, during)`` gaps [ms] of a token stream (arrival times, s): a gap is *during* when
    its interval overlaps one of ``windows`` (start, end), else steady; the first two gaps (the
    request's own prefill and first decode) are left out."""
    steady: list[float] = []
    during: list[float] = []
    for a, b in list(zip(times_s, times_s[1:]))[2:]:
        target = during if any(a < end and b > start for start, end in windows) else steady
        target.append((b - a) * 1e3)
    return steady, during


async def probe_itl_during_prefill(
    client: ProbeClient, short_ids: Sequence[int], long_ids: Sequence[int], max_tokens: int = DECODE_TOKENS
) -> tuple[list[float], list[float], list[float]]:
    """The decoding request's (steady, during-prefill) gaps [ms] (module doc) and the prefill
    windows [ms] of the partners it outlived (one that ended first leaves no more partners: a
    prefill with no decoder beside it measures nothing here)."""
    d = await client.start(short_ids, max_tokens)
    windows = []
    try:
        await _wait(lambda: len(d.token_times_s) >= STEADY_TOKENS + 3 or d.done, "the steady decode")
        for _ in range(NUM_PARTNERS):
            if d.done:
                break
            p = await client.start(long_ids, 1, cache_salt=uuid.uuid4().hex)  # a salt of its own: no cache hit
            await _wait(lambda p=p: bool(p.token_times_s) or p.done, "a partner's first token")
            windows.append((p.sent_s, p.token_times_s[0] if p.token_times_s else time.monotonic()))
            mark = len(d.token_times_s)
            await _wait(lambda mark=mark: len(d.token_times_s) >= mark + STEADY_TOKENS or d.done, "steady gaps")
    finally:
        if not d.done:
            await client.cancel(d)
    last = d.token_times_s[-1] if d.token_times_s else 0.0
    partners = [(end - start) * 1e3 for start, end in windows if end <= last]
    return (*split_gaps(d.token_times_s, windows), partners)


async def run_probes(
    client: ProbeClient,
    short_ids: Sequence[int],
    long_ids: Sequence[int],
    max_batch_size: int,
    max_seq_len: int,
    *,
    cancel: bool,
    itl: bool,
) -> ProbeResult:
    """The probes asked for (``cancel``, ``itl``), then ``client.close()``. Output lengths are
    capped so that every request fits ``max_seq_len``."""
    room = max(1, max_seq_len - len(short_ids) - 1)
    try:
        if itl:
            steady, during, partners = await probe_itl_during_prefill(
                client, short_ids, long_ids, min(DECODE_TOKENS, room)
            )
        else:
            steady, during, partners = [], [], []
        cancels = (
            await probe_cancel(client, short_ids, max_batch_size, min(CANCEL_OUTPUT_TOKENS, room)) if cancel else ()
        )
    finally:
        await client.close()
    return ProbeResult(cancels, tuple(steady), tuple(during), tuple(partners))


__all__ = [
    "ProbeClient",
    "ProbeResult",
    "Stream",
    "probe_cancel",
    "probe_itl_during_prefill",
    "run_probes",
    "split_gaps",
]
