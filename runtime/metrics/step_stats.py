"""Per-step counters of one run (decode batch size, KV blocks used, peak RSS, the leak check).

Filled in by the engine loop on the same monotonic clock as the request timers
(:mod:`trtpipe.runtime.metrics.request_metrics`); summarized by :func:`trtpipe.runtime.metrics.request_metrics.summarize`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from trtpipe.runtime.errors import MetricsError


@dataclass
class StepStats:
    """Per-step counters of one run, filled in by the engine loop (mutable recorder).

    ``num_kv_blocks`` is the pool capacity (blocks a sequence can own; the null block excluded),
    used to draw the occupancy plot; it may stay ``None``.
    """

    num_kv_blocks: int | None = None
    step_times_s: list[float] = field(default_factory=list)  # monotonic clock, seconds
    decode_batch_sizes: list[int] = field(default_factory=list)  # sequences decoded per step
    kv_blocks_used: list[int] = field(default_factory=list)  # blocks owned after the step
    peak_rss_bytes: int | None = None
    kv_blocks_in_use_at_end: int | None = None  # set by on_run_end; 0 means no leak
    # validate --url: the server's mean ms per first-token stage over the run's streamed requests
    # (trtpipe.runtime.serve.first_token_path's stages, read from /metrics; () when not exported)
    server_first_token_path_ms: tuple[tuple[str, float], ...] = ()

    def on_step(self, t: float, *, decode_batch_size: int, kv_blocks_used: int) -> None:
        """Record one scheduler step that ended at ``t`` (seconds, same clock as the timers)."""
        if decode_batch_size < 0 or kv_blocks_used < 0:
            raise MetricsError(
                f"step at t={t!r}: decode_batch_size={decode_batch_size}, "
                f"kv_blocks_used={kv_blocks_used}; expected both >= 0"
            )
        if self.step_times_s and t < self.step_times_s[-1]:
            raise MetricsError(
                f"step time {t!r} s is earlier than the previous step "
                f"({self.step_times_s[-1]!r} s); use one monotonic clock"
            )
        self.step_times_s.append(float(t))
        self.decode_batch_sizes.append(int(decode_batch_size))
        self.kv_blocks_used.append(int(kv_blocks_used))

    def on_rss(self, rss_bytes: int | None = None) -> None:
        """Fold a resident-set-size sample into the peak (default: :func:`read_peak_rss_bytes`)."""
        rss = read_peak_rss_bytes() if rss_bytes is None else int(rss_bytes)
        self.peak_rss_bytes = rss if self.peak_rss_bytes is None else max(self.peak_rss_bytes, rss)

    def on_run_end(self, kv_blocks_in_use: int) -> None:
        """Record the blocks still owned after every request finished (leak check: must be 0)."""
        self.kv_blocks_in_use_at_end = int(kv_blocks_in_use)


def read_peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (``getrusage`` ``ru_maxrss``).

    Linux reports kibibytes and macOS bytes; both are converted to bytes.
    """
    import resource  # POSIX only; imported here so the module loads anywhere

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


__all__ = ["StepStats", "read_peak_rss_bytes"]
