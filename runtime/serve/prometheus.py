"""Prometheus metrics of the server: vLLM's names, definitions and bucket lists, ``trtpipe:`` prefix.

Names and buckets follow vLLM v1 (``vllm/v1/metrics/loggers.py``), so dashboards written for
``vllm:*`` read ``trtpipe:*`` after a prefix change. The latency histograms are observed from the
same per-request :class:`~trtpipe.runtime.metrics.request_metrics.RequestMetrics` that ``trtpipe validate`` reports
(one monotonic clock, DESIGN.md "Metrics"), when the request finishes:

=============================================  ====================================================
histogram                                      one observation of
=============================================  ====================================================
time_to_first_token_seconds                    TTFT = first token - arrival, per request with output
inter_token_latency_seconds                    every gap between consecutive output tokens (ITL)
request_time_per_output_token_seconds          TPOT = (last - first token) / (n - 1), per request, n >= 2
e2e_request_latency_seconds                    E2E = last token - arrival, per request with output
request_queue_time_seconds                     first prefill start - arrival, per request admitted
first_token_path_seconds{stage}                the server's stages to a stream's first token chunk
                                               (trtpipe's own: :mod:`~trtpipe.runtime.serve.first_token_path`)
=============================================  ====================================================

Counters: ``prompt_tokens`` (prompt tokens of requests that got their prefill), ``generation_tokens``
(output tokens), ``request_success{finished_reason}`` (every finished request, by reason: stop,
length, abort, timeout, error), ``num_preemptions``, ``requests_rejected{reason}`` (queue_full,
overloaded, shutting_down, engine_dead, bad_request, too_large, unauthorized), ``prefix_cache_queries`` /
``prefix_cache_hits`` (prompt tokens looked up in / found in the prefix cache, vLLM v1's counters; hit rate = hits /
queries; read from ``LLM.prefix_cache_queries`` / ``_hits`` at scrape time),
``ignored_request_fields{field}`` (request fields neither OpenAI's nor a known extension: ignored,
as vLLM does, and counted; the field name is truncated to 64 characters). Gauges are read at scrape time from the
engine: ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` (fraction of
usable KV blocks in use, 0..1, as vLLM), ``kv_blocks_in_use``. Speculative decoding's counters:
:mod:`trtpipe.runtime.serve.spec_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from trtpipe.runtime.llm import RequestOutput
from trtpipe.runtime.serve.first_token_path import METRIC, STAGES
from trtpipe.runtime.serve.spec_metrics import SpecMetrics

PREFIX = "trtpipe:"
MAX_IGNORED_FIELD_LABELS = 64  # distinct unknown-field names with their own series (then "_other")

# vLLM v1 bucket lists (seconds).
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


def _first_token_path_histograms(reg: CollectorRegistry, model_name: str) -> dict[str, Any]:
    """``first_token_path_seconds{model_name, stage}``: one child histogram per stage."""
    doc = "Server time from the handler's start to a stream's first token chunk written, by stage (s)."
    path = Histogram(PREFIX + METRIC, doc, ("model_name", "stage"), registry=reg, buckets=TTFT_BUCKETS_S)
    return {stage: path.labels(model_name, stage) for stage in STAGES}


class ServeMetrics:
    """The server's Prometheus registry (its own, so several servers can live in one process)."""

    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # no *_created samples, as vLLM (halves the scrape size)
        self.registry = CollectorRegistry()
        labels = ("model_name",)
        reg = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, registry=reg, buckets=buckets).labels(model_name)

        self.ttft = hist("time_to_first_token_seconds", "TTFT: first token - arrival (s).", TTFT_BUCKETS_S)
        self.itl = hist("inter_token_latency_seconds", "Gap between consecutive output tokens (s).", ITL_BUCKETS_S)
        self.tpot = hist(
            "request_time_per_output_token_seconds",
            "TPOT per request: (last - first token) / (output tokens - 1) (s).",
            ITL_BUCKETS_S,
        )
        self.e2e = hist("e2e_request_latency_seconds", "E2E: last token - arrival (s).", REQUEST_LATENCY_BUCKETS_S)
        self.queue = hist("request_queue_time_seconds", "First prefill start - arrival (s).", REQUEST_LATENCY_BUCKETS_S)
        self._first_token_path = _first_token_path_histograms(reg, model_name)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prefilled prompt tokens.", labels, registry=reg).labels(
            model_name
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens.", labels, registry=reg
        ).labels(model_name)
        self._success = Counter(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            (*labels, "finished_reason"),
            registry=reg,
        )
        self._preemptions = Counter(
            PREFIX + "num_preemptions", "Preemptions (KV freed, recomputed).", labels, registry=reg
        ).labels(model_name)
        self._rejected = Counter(
            PREFIX + "requests_rejected", "Requests refused before admission.", (*labels, "reason"), registry=reg
        )
        doc = "Unknown request fields ignored (vLLM logs them), by field name."
        self._ignored = Counter(PREFIX + "ignored_request_fields", doc, (*labels, "field"), registry=reg)
        self._ignored_seen: set[str] = set()
        self._prefix = {
            name: Counter(PREFIX + name, doc, labels, registry=reg).labels(model_name)
            for name, doc in (
                ("prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up."),
                ("prefix_cache_hits", "Prefix cache hits, in prompt tokens found in the cache."),
            )
        }
        self._prefix_seen = {name: 0 for name in self._prefix}
        self._gauges = {
            name: Gauge(PREFIX + name, doc, labels, registry=reg).labels(model_name)
            for name, doc in (
                ("num_requests_running", "Requests in the running batch."),
                ("num_requests_waiting", "Requests waiting for admission."),
                ("kv_cache_usage_perc", "Fraction of usable KV blocks in use (0..1)."),
                ("kv_blocks_in_use", "KV blocks owned by requests."),
            )
        }
        self.model_name = model_name
        self._num_preemptions_seen = 0
        self.spec = SpecMetrics(reg, model_name)

    def bind(self, read: Callable[[], dict[str, Any]]) -> None:
        """Read the gauges (and the preemption count) from the engine at scrape time: ``read()``
        returns num_requests_running, num_requests_waiting, kv_cache_usage_perc, kv_blocks_in_use,
        the running totals num_preemptions, prefix_cache_queries and prefix_cache_hits, and ``spec``
        (speculative decoding's :class:`~trtpipe.runtime.metrics.spec_counters.SpeculationCounters`, or None)."""
        self._read = read

    def on_finished(self, out: RequestOutput) -> None:
        """Observe one finished request (engine thread)."""
        reason = out.finish_reason or "error"
        self._success.labels(self.model_name, reason).inc()
        m = out.metrics
        if m is None:
            return
        if m.queue_s is not None:
            self.queue.observe(m.queue_s)
            self.prompt_tokens.inc(m.prompt_tokens)
        self.generation_tokens.inc(m.output_tokens)
        if m.ttft_s is not None:
            self.ttft.observe(m.ttft_s)
        if m.e2e_s is not None:
            self.e2e.observe(m.e2e_s)
        if m.tpot_s is not None:
            self.tpot.observe(m.tpot_s)
        for gap in m.itl_s:
            self.itl.observe(gap)

    def on_first_token_path(self, seconds_by_stage: dict[str, float]) -> None:
        """Observe one stream's first-token stages (event loop; keys from ``STAGES``)."""
        for stage, seconds in seconds_by_stage.items():
            self._first_token_path[stage].observe(seconds)

    def on_ignored_fields(self, fields: tuple[str, ...]) -> None:
        """Count the unknown fields of one request (``ignored_request_fields_total{field}``). Field
        names come from clients: past MAX_IGNORED_FIELD_LABELS distinct names the rest count as
        ``field="_other"``, so a client cannot grow the scrape without bound."""
        for name in fields:
            if name not in self._ignored_seen and len(self._ignored_seen) >= MAX_IGNORED_FIELD_LABELS:
                name = "_other"
            self._ignored_seen.add(name)
            self._ignored.labels(self.model_name, name).inc()

    def on_rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        """The exposition text (``text/plain; version=0.0.4``)."""
        read = getattr(self, "_read", None)
        if read is not None:
            values = read()
            for name, gauge in self._gauges.items():
                gauge.set(values[name])
            total = int(values["num_preemptions"])
            if total > self._num_preemptions_seen:
                self._preemptions.inc(total - self._num_preemptions_seen)
                self._num_preemptions_seen = total
            for name, counter in self._prefix.items():
                total = int(values[name])
                if total > self._prefix_seen[name]:
                    counter.inc(total - self._prefix_seen[name])
                    self._prefix_seen[name] = total
            if values.get("spec") is not None:
                self.spec.update(values["spec"])
        return generate_latest(self.registry)


__all__ = ["ServeMetrics", "PREFIX", "TTFT_BUCKETS_S", "ITL_BUCKETS_S", "REQUEST_LATENCY_BUCKETS_S"]
