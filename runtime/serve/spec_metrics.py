"""Speculative decoding's Prometheus series, vLLM v1's names (``vllm/v1/spec_decode/metrics.py``)
with the ``trtpipe:`` prefix, brought up to the speculator's running totals at scrape time:

=============================================  ====================================================
series                                         counts
=============================================  ====================================================
spec_decode_num_drafts                         verify rows run (vLLM: drafts)
spec_decode_num_draft_tokens                   proposed tokens verified
spec_decode_num_accepted_tokens                proposed tokens accepted
spec_decode_num_accepted_tokens_per_pos        ..., by position in the proposal (label position)
spec_decode_acceptance_length (histogram)      tokens one verify emitted: 1 + accepted (trtpipe's)
=============================================  ====================================================

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts (vLLM's
definitions). The histogram is trtpipe's own (vLLM derives the mean from the counters only).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "trtpipe:"


class SpecMetrics:
    """The series above in ``registry`` (created at once, so a scrape shows them at 0 while off)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_length: int = 17) -> None:
        labels = ("model_name",)
        self.model_name = model_name

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=registry).labels(model_name)

        self._totals = {
            "num_drafts": counter("spec_decode_num_drafts", "Speculative verify rows run."),
            "num_draft_tokens": counter("spec_decode_num_draft_tokens", "Proposed tokens verified."),
            "num_accepted_tokens": counter("spec_decode_num_accepted_tokens", "Proposed tokens accepted."),
        }
        self._per_pos = Counter(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens accepted, by position in the proposal (0 = first).",
            (*labels, "position"),
            registry=registry,
        )
        self._length = Histogram(
            PREFIX + "spec_decode_acceptance_length",
            "Tokens one speculative verify emitted (1 + accepted proposed tokens).",
            labels,
            registry=registry,
            buckets=tuple(float(n) for n in range(1, max_length + 1)),
        ).labels(model_name)
        self._seen: dict[str, int] = {name: 0 for name in self._totals}
        self._seen_pos: list[int] = []
        self._seen_len: list[int] = []

    def update(self, counters) -> None:
        """Bring the series up to ``counters`` (a :class:`~trtpipe.runtime.metrics.spec_counters.SpeculationCounters`)."""
        for name, series in self._totals.items():
            total = int(getattr(counters, name))
            if total > self._seen[name]:
                series.inc(total - self._seen[name])
                self._seen[name] = total
        for pos, total in enumerate(counters.accepted_per_position):
            seen = self._seen_pos[pos] if pos < len(self._seen_pos) else 0
            if total > seen:
                self._per_pos.labels(self.model_name, str(pos)).inc(total - seen)
        self._seen_pos = list(counters.accepted_per_position)
        for length, total in enumerate(counters.acceptance_length_counts):
            seen = self._seen_len[length] if length < len(self._seen_len) else 0
            for _ in range(total - seen):
                self._length.observe(length)
        self._seen_len = list(counters.acceptance_length_counts)


__all__ = ["SpecMetrics"]
