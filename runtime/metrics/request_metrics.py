"""Request latency metrics: TTFT, TPOT, ITL, E2E, and run-level step statistics.

Definitions (DESIGN.md "Metrics"; the same conventions as vLLM ``benchmark_serving.py`` and
NVIDIA genai-perf), all from one monotonic clock, stored in **seconds**:

    arrival ──queue── prefill start ──prefill── prefill end ... tok0 ── tok1 ── tok2 ... tokN-1
    │◄────────────── TTFT = tok0 - arrival ─────────────────────►│
                                                                 │◄─ITL─►│◄─ITL─►│
    │◄──────────────────────── E2E = tokN-1 - arrival ──────────────────────────────────►│
    TPOT = (tokN-1 - tok0) / (N - 1)       (excludes the first token; undefined for N < 2)

- TTFT includes queueing: it is measured from *arrival*, not from when the scheduler admitted
  the request. The prefill-only part is reported separately as ``prefill_s``.
- TPOT is ``None`` (not zero) for a request with fewer than two output tokens, and such a request
  is left out of TPOT percentiles.
- ITL is the list of gaps between consecutive output tokens of one request; the TTFT interval is
  never one of them. Percentiles of ITL are taken over all tokens of all requests.
- An empty chunk (zero tokens) never counts as the first token.

Percentiles (:mod:`trtpipe.runtime.metrics.percentiles`) use linear interpolation between closest ranks:
the same as ``numpy.percentile(values, q, method="linear")`` (numpy's default; Hyndman & Fan 1996,
type 7). Per-step counters are in :mod:`trtpipe.runtime.metrics.step_stats`.

Nothing here imports numpy or torch: the metrics run on an embedded target as is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from trtpipe.runtime.errors import MetricsError
from trtpipe.runtime.metrics.percentiles import PERCENTILE_METHOD, PERCENTILES, Percentiles, percentile
from trtpipe.runtime.metrics.step_stats import StepStats, read_peak_rss_bytes

# Re-exported for importers of this module: MetricsError, PERCENTILE_METHOD, PERCENTILES,
# Percentiles, percentile (runtime/metrics/percentiles.py), StepStats, read_peak_rss_bytes (step_stats.py).

# ---------------------------------------------------------------------------------------------
# Per request
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestMetrics:
    """Frozen latency record of one request; every ``*_s`` field is in seconds.

    ``ttft_s`` and ``e2e_s`` are ``None`` when the request produced no output token;
    ``tpot_s`` is ``None`` when it produced fewer than two; ``prefill_s`` and ``queue_s`` are
    ``None`` when the prefill events were not recorded.
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None  # first_token - arrival (queueing included)
    tpot_s: float | None  # (last_token - first_token) / (output_tokens - 1)
    itl_s: tuple[float, ...]  # [output_tokens - 1] gaps between consecutive tokens
    e2e_s: float | None  # last_token - arrival
    prefill_s: float | None  # last prefill end - first prefill start (prefill-only time)
    queue_s: float | None  # first prefill start - arrival
    finish_reason: str | None = None
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    def to_dict(self) -> dict:
        """JSON-ready dict in **milliseconds** (``*_ms`` keys), as written to report.json."""
        return {
            "request_id": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": _ms(self.ttft_s),
            "tpot_ms": _ms(self.tpot_s),
            "itl_ms": [x * 1000.0 for x in self.itl_s],
            "e2e_ms": _ms(self.e2e_s),
            "prefill_ms": _ms(self.prefill_s),
            "queue_ms": _ms(self.queue_s),
            "finish_reason": self.finish_reason,
            "cached_prompt_tokens": self.cached_prompt_tokens,
        }


class RequestTimer:
    """Collects the timing events of one request, then freezes them into :class:`RequestMetrics`.

    Every event takes a time ``t`` in seconds from the same monotonic clock as the arrival;
    ``t=None`` reads ``clock()`` (``time.monotonic`` by default; tests inject a fake one).
    Events must not go back in time: that is a bug in the caller and raises :class:`MetricsError`.

    Usage, from the engine loop::

        timer = RequestTimer("req-1", prompt_tokens=42)     # arrival = clock()
        timer.on_prefill_start(); ...; timer.on_prefill_end()
        timer.on_tokens(t, 1, text)                         # once per streamed chunk
        timer.finish(reason="stop")
        record = timer.metrics()
    """

    def __init__(
        self,
        request_id: str,
        *,
        prompt_tokens: int = 0,
        arrival_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if prompt_tokens < 0:
            raise MetricsError(f"prompt_tokens={prompt_tokens} for request {request_id!r}: expected >= 0")
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._clock = clock
        self.arrival_s: float = clock() if arrival_s is None else float(arrival_s)
        self.prefill_start_s: float | None = None
        self.prefill_end_s: float | None = None
        # One entry per output token (a multi-token step records its tokens at the same t).
        self.token_times_s: list[float] = []
        self.finish_s: float | None = None
        self.finish_reason: str | None = None
        self.cached_prompt_tokens = 0  # set by the engine loop at admission (prefix cache)
        self._last_event_s = self.arrival_s

    # -- events ---------------------------------------------------------------------------

    def on_prefill_start(self, t: float | None = None) -> None:
        """The scheduler put (the first chunk of) this prompt into a prefill step.

        Only the first call counts, so a chunked (or preempted and recomputed) prefill keeps
        its original queueing time.
        """
        t = self._now(t, "prefill start")
        if self.prefill_start_s is None:
            self.prefill_start_s = t

    def on_prefill_end(self, t: float | None = None) -> None:
        """A prefill step containing this prompt finished; the last call counts (last chunk)."""
        t = self._now(t, "prefill end")
        if self.prefill_start_s is None:
            raise MetricsError(
                f"request {self.request_id!r}: on_prefill_end before on_prefill_start; "
                "call on_prefill_start when the prompt enters a prefill step"
            )
        self.prefill_end_s = t

    def on_tokens(self, t: float | None, num_tokens: int, text: str = "") -> None:
        """``num_tokens`` output tokens became available at ``t``.

        A call with ``num_tokens == 0`` (an empty chunk) is ignored for timing, so it never
        becomes the first token. ``num_tokens > 1`` (e.g. a multi-token step) records every token
        at ``t``, which adds zero-length ITL gaps, exactly as a client would observe them.
        ``text`` is accepted for symmetry with the streaming path and does not affect timing:
        timing is per token, and a token whose text the detokenizer holds back is still a token.
        """
        if num_tokens < 0:
            raise MetricsError(f"request {self.request_id!r}: num_tokens={num_tokens}, expected >= 0")
        if num_tokens == 0:
            return
        t = self._now(t, "token")
        self.token_times_s.extend([t] * num_tokens)

    def finish(self, t: float | None = None, reason: str | None = None) -> None:
        """The request ended (``reason``: "stop", "length", "abort", ...)."""
        self.finish_s = self._now(t, "finish")
        self.finish_reason = reason

    # -- result ---------------------------------------------------------------------------

    def metrics(self) -> RequestMetrics:
        """Freeze the events into a :class:`RequestMetrics` (may be called before finish)."""
        times = self.token_times_s
        n = len(times)
        ttft = times[0] - self.arrival_s if n else None
        e2e = times[-1] - self.arrival_s if n else None
        tpot = (times[-1] - times[0]) / (n - 1) if n >= 2 else None
        # Gaps between tokens only: the arrival -> first token interval is TTFT, not an ITL.
        itl = tuple(b - a for a, b in zip(times, times[1:]))
        prefill = (
            self.prefill_end_s - self.prefill_start_s
            if self.prefill_start_s is not None and self.prefill_end_s is not None
            else None
        )
        queue = self.prefill_start_s - self.arrival_s if self.prefill_start_s is not None else None
        return RequestMetrics(
            request_id=self.request_id,
            prompt_tokens=self.prompt_tokens,
            output_tokens=n,
            ttft_s=ttft,
            tpot_s=tpot,
            itl_s=itl,
            e2e_s=e2e,
            prefill_s=prefill,
            queue_s=queue,
            finish_reason=self.finish_reason,
            cached_prompt_tokens=self.cached_prompt_tokens,
        )

    def _now(self, t: float | None, event: str) -> float:
        t = self._clock() if t is None else float(t)
        if t < self._last_event_s:
            raise MetricsError(
                f"request {self.request_id!r}: {event} time {t!r} s is earlier than the previous "
                f"event ({self._last_event_s!r} s); all events must come from one monotonic clock"
            )
        self._last_event_s = t
        return t


# ---------------------------------------------------------------------------------------------
# Run summary
# ---------------------------------------------------------------------------------------------

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e", "prefill", "queue")


@dataclass(frozen=True)
class MetricsSummary:
    """Frozen summary of one scenario run. Latencies in seconds; see :meth:`to_dict` for ms.

    ``ttft``/``tpot``/``e2e``/``prefill``/``queue`` are distributions over requests (requests
    without a value are excluded, never counted as zero); ``itl`` is over all token gaps of all
    requests. A distribution with no data is ``None``.
    """

    num_requests: int
    num_requests_without_output: int
    total_prompt_tokens: int
    total_output_tokens: int
    wall_s: float
    output_tokens_per_s: float | None  # total_output_tokens / wall_s; None if wall_s == 0
    ttft: Percentiles | None
    tpot: Percentiles | None
    itl: Percentiles | None
    e2e: Percentiles | None
    prefill: Percentiles | None
    queue: Percentiles | None
    peak_decode_batch_size: int | None = None
    mean_decode_batch_size: float | None = None  # over steps that decoded >= 1 sequence
    peak_kv_blocks_used: int | None = None
    num_kv_blocks: int | None = None
    # (seconds since the first step, blocks used) per step: the occupancy plot's data.
    kv_occupancy: tuple[tuple[float, int], ...] = ()
    peak_rss_bytes: int | None = None
    kv_blocks_in_use_at_end: int | None = None
    # Prefix cache, in prompt tokens over the run's requests (first admission of each):
    # queries = total_prompt_tokens looked up, hits = those found cached (vLLM's names).
    prefix_cache_hits_tokens: int = 0
    # validate --url: the server's mean ms per first-token stage (StepStats' field of the same name)
    server_first_token_path_ms: tuple[tuple[str, float], ...] = ()

    @property
    def kv_leak_free(self) -> bool | None:
        """True when every KV block was free after the run; ``None`` when it was not checked."""
        if self.kv_blocks_in_use_at_end is None:
            return None
        return self.kv_blocks_in_use_at_end == 0

    def latency_ms(self, metric: str, pct: str) -> float | None:
        """``metric`` ("ttft", "tpot", "itl", "e2e", "prefill", "queue") at ``pct`` ("p95"), in ms.

        ``None`` when the metric has no data (e.g. TPOT when every request had one token).
        """
        if metric not in LATENCY_METRICS:
            raise MetricsError(f"metric {metric!r}: expected one of {', '.join(LATENCY_METRICS)}")
        dist: Percentiles | None = getattr(self, metric)
        return None if dist is None else dist.get(pct) * 1000.0

    def to_dict(self) -> dict:
        """JSON-ready dict; latencies in **milliseconds** under ``*_ms`` keys."""
        out: dict = {
            "percentile_method": PERCENTILE_METHOD,
            "num_requests": self.num_requests,
            "num_requests_without_output": self.num_requests_without_output,
            "total_prompt_tokens": self.total_prompt_tokens,
            "total_output_tokens": self.total_output_tokens,
            "wall_s": self.wall_s,
            "output_tokens_per_s": self.output_tokens_per_s,
        }
        for name in LATENCY_METRICS:
            dist: Percentiles | None = getattr(self, name)
            out[f"{name}_ms"] = None if dist is None else dist.to_ms_dict()
        out.update(
            peak_decode_batch_size=self.peak_decode_batch_size,
            mean_decode_batch_size=self.mean_decode_batch_size,
            peak_kv_blocks_used=self.peak_kv_blocks_used,
            num_kv_blocks=self.num_kv_blocks,
            kv_occupancy=[[t, n] for t, n in self.kv_occupancy],
            peak_rss_bytes=self.peak_rss_bytes,
            kv_blocks_in_use_at_end=self.kv_blocks_in_use_at_end,
            kv_leak_free=self.kv_leak_free,
            prefix_cache_queries_tokens=self.total_prompt_tokens,
            prefix_cache_hits_tokens=self.prefix_cache_hits_tokens,
            server_first_token_path_ms=dict(self.server_first_token_path_ms),
            prefix_cache_hit_rate=(
                self.prefix_cache_hits_tokens / self.total_prompt_tokens if self.total_prompt_tokens else None
            ),
        )
        return out


def summarize(requests: Sequence[RequestMetrics], wall_s: float, step_stats: StepStats | None = None) -> MetricsSummary:
    """Summarize one scenario: percentiles, throughput and step statistics.

    ``wall_s`` is the run's wall time in seconds (first arrival to last token, as the caller
    measured it); output tokens/s = total output tokens / ``wall_s`` (vLLM's "output token
    throughput"). ``step_stats`` adds decode batch sizes, KV occupancy, peak RSS and the leak
    check; without it those fields are ``None``.
    """
    if wall_s < 0 or math.isnan(wall_s):
        raise MetricsError(f"wall_s={wall_s!r}: expected a duration >= 0 in seconds")
    total_out = sum(r.output_tokens for r in requests)

    def dist(values: Iterable[float | None]) -> Percentiles | None:
        return Percentiles.of([v for v in values if v is not None])

    steps = step_stats or StepStats()
    decode_sizes = [b for b in steps.decode_batch_sizes if b > 0]
    t0 = steps.step_times_s[0] if steps.step_times_s else 0.0
    return MetricsSummary(
        num_requests=len(requests),
        num_requests_without_output=sum(1 for r in requests if r.output_tokens == 0),
        total_prompt_tokens=sum(r.prompt_tokens for r in requests),
        total_output_tokens=total_out,
        wall_s=float(wall_s),
        output_tokens_per_s=total_out / wall_s if wall_s > 0 else None,
        ttft=dist(r.ttft_s for r in requests),
        tpot=dist(r.tpot_s for r in requests),
        itl=dist(gap for r in requests for gap in r.itl_s),
        e2e=dist(r.e2e_s for r in requests),
        prefill=dist(r.prefill_s for r in requests),
        queue=dist(r.queue_s for r in requests),
        peak_decode_batch_size=max(steps.decode_batch_sizes) if steps.decode_batch_sizes else None,
        mean_decode_batch_size=sum(decode_sizes) / len(decode_sizes) if decode_sizes else None,
        peak_kv_blocks_used=max(steps.kv_blocks_used) if steps.kv_blocks_used else None,
        num_kv_blocks=steps.num_kv_blocks,
        kv_occupancy=tuple((t - t0, n) for t, n in zip(steps.step_times_s, steps.kv_blocks_used)),
        peak_rss_bytes=steps.peak_rss_bytes,
        kv_blocks_in_use_at_end=steps.kv_blocks_in_use_at_end,
        prefix_cache_hits_tokens=sum(r.cached_prompt_tokens for r in requests),
        server_first_token_path_ms=steps.server_first_token_path_ms,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


__all__ = [
    "PERCENTILE_METHOD",
    "PERCENTILES",
    "LATENCY_METRICS",
    "MetricsError",
    "RequestMetrics",
    "RequestTimer",
    "Percentiles",
    "StepStats",
    "MetricsSummary",
    "percentile",
    "read_peak_rss_bytes",
    "summarize",
]
