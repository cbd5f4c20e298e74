"""Defaults of ``trtpipe serve``'s limits, shared by the CLI flags (:mod:`trtpipe.pipeline.cli.serve`),
:class:`~trtpipe.runtime.serve.server.ServeConfig` and :class:`~trtpipe.runtime.serve.state.ServeState`.
No imports: the CLI reads them without the serve extra installed."""

from __future__ import annotations

# Past this predicted wait a request is refused (503 + Retry-After) rather than queued into a TTFT
# nobody waits for: sustained overload, not a burst (a burst of 22 chat requests on the 2-core host
# predicted 3.6 s; the seed article: "over 3 s most users give up"). An interactive deployment sets
# it lower (docs/server.md: admission).
DEFAULT_MAX_QUEUE_WAIT_MS = 10000.0
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a max_seq_len prompt needs far less (docs/server.md: limits)

__all__ = ["DEFAULT_MAX_QUEUE_WAIT_MS", "DEFAULT_MAX_REQUEST_BYTES"]
