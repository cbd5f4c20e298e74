"""Where a streamed request's time to first token goes inside the server, stage by stage.

One monotonic clock (``time.monotonic``, seconds) on both threads. The handler stamps its side
(:class:`HandlerStamps`), the engine thread stamps its own on the request's first token event
(:class:`EngineStamps`, carried by the first ``Delta``), and when the first chunk with tokens has
been written to the socket the stream turns both into durations (:func:`first_token_path_s`),
observed in ``trtpipe:first_token_path_seconds{stage}`` (:mod:`~trtpipe.runtime.serve.prometheus`;
one histogram per stage, TTFT's buckets)
so ``trtpipe validate --url`` can print the split beside the TTFT it measures at the client::

    stage        from                                   to
    ───────────  ─────────────────────────────────────  ──────────────────────────────────────────
    parse        the handler starts                     body read, JSON parsed, fields checked
    tokenize     fields checked                         prompt ids back on the event loop
                                                        (worker-thread hand-off included)
    submit       prompt ids back                        requests checked and put on the channel
    pickup       on the channel                         taken by the engine thread
    engine       taken by the engine thread             the step that sampled the first token
                                                        returned (scheduling, prefill, sampling,
                                                        detokenizing: the in-process TTFT's part)
    publish      that step returned                     the first Delta posted to the event loop
    write        the first Delta posted                 its SSE chunk written (event-loop wake-up,
                                                        the GIL, JSON, the socket write)

What the client adds around this (uvicorn's HTTP parsing before the handler, the loopback, the
client's own parsing) is its TTFT minus the sum of the stages. Non-streamed requests are not
observed (their first token is not visible to a client).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

METRIC = "first_token_path_seconds"  # after the server's "trtpipe:" prefix
STAGES = ("parse", "tokenize", "submit", "pickup", "engine", "publish", "write")


@dataclass
class HandlerStamps:
    """The event loop's stamps of one request, seconds on ``time.monotonic``; filled in as the
    handler goes (0.0 = not reached yet)."""

    received_s: float = 0.0
    parsed_s: float = 0.0
    encoded_s: float = 0.0
    submitted_s: float = 0.0

    @classmethod
    def now(cls) -> HandlerStamps:
        return cls(received_s=time.monotonic())


@dataclass(frozen=True)
class EngineStamps:
    """The engine thread's stamps of one request's first token, seconds on ``time.monotonic``."""

    taken_s: float  # the request left the channel (EngineLoop._add)
    step_end_s: float  # the step that produced its first token returned
    posted_s: float  # its first Delta was handed to the event loop


def first_token_path_s(handler: HandlerStamps, engine: EngineStamps, written_s: float) -> dict[str, float]:
    """Seconds per stage (:data:`STAGES` order); each >= 0 on one monotonic clock.

    Raises:
        ValueError: a stamp is missing (0.0) or the stamps are out of order (a caller's bug).
    """
    marks = (
        handler.received_s,
        handler.parsed_s,
        handler.encoded_s,
        handler.submitted_s,
        engine.taken_s,
        engine.step_end_s,
        engine.posted_s,
        written_s,
    )
    if min(marks) <= 0.0 or any(b < a for a, b in zip(marks, marks[1:])):
        raise ValueError(f"first-token stamps {marks}: expected all > 0 and non-decreasing")
    return {stage: b - a for stage, a, b in zip(STAGES, marks, marks[1:])}


def read_first_token_path(exposition: str, prefix: str = "trtpipe:") -> dict[str, tuple[float, int]]:
    """(sum of seconds, count) per stage from a ``/metrics`` text; {} when the server exports none.

    ``validate --url`` reads it before and after a scenario; the difference's sum / count is the
    mean per stage over the scenario's streamed requests."""
    out: dict[str, list[float]] = {}
    for line in exposition.splitlines():
        if not line.startswith(prefix + METRIC + "_"):
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("} ")
        stage = next((p.split("=", 1)[1].strip('"') for p in labels.split(",") if p.startswith("stage=")), None)
        if stage is None:
            continue
        pair = out.setdefault(stage, [0.0, 0.0])
        if name.endswith("_sum"):
            pair[0] = float(value)
        elif name.endswith("_count"):
            pair[1] = float(value)
    return {stage: (s, int(n)) for stage, (s, n) in out.items()}


def mean_ms_between(
    before: dict[str, tuple[float, int]], after: dict[str, tuple[float, int]]
) -> tuple[tuple[str, float], ...]:
    """Mean milliseconds per stage over the requests observed between two readings; () when none."""
    rows = []
    for stage in STAGES:
        s1, n1 = after.get(stage, (0.0, 0))
        s0, n0 = before.get(stage, (0.0, 0))
        if n1 > n0:
            rows.append((stage, (s1 - s0) / (n1 - n0) * 1e3))
    return tuple(rows)


__all__ = [
    "METRIC",
    "STAGES",
    "HandlerStamps",
    "EngineStamps",
    "first_token_path_s",
    "read_first_token_path",
    "mean_ms_between",
]
