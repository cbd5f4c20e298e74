"""Run the server: uvicorn first (``/health`` answers 503 while loading), then load the model in a
thread, start the engine loop, and print the ready line with the URL.

Shutdown on SIGTERM / SIGINT (graceful, then exit 0)::

    signal ─► stop admitting (new requests 503, /health 503)
           ─► running and queued requests continue for up to ``shutdown_grace_s``
           ─► the rest are cancelled (streams end with finish_reason "abort"), KV freed
           ─► uvicorn closes the connections ─► exit 0
    a second SIGINT forces the exit at once.

uvicorn normally re-raises a captured signal after it stopped (so the process dies *by* the
signal, exit 143/130); this server handles the signal itself and returns normally instead.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from trtpipe.runtime.serve.app import create_app
from trtpipe.runtime.serve.defaults import DEFAULT_MAX_QUEUE_WAIT_MS, DEFAULT_MAX_REQUEST_BYTES
from trtpipe.runtime.serve.engine_loop import EngineLoop
from trtpipe.runtime.serve.prometheus import ServeMetrics
from trtpipe.runtime.serve.protocol.limits import max_token_bytes
from trtpipe.runtime.serve.startup import prepare
from trtpipe.runtime.serve.state import ServeState
from trtpipe.runtime.speculative.config import SpeculativeConfig

EXIT_USAGE = 2  # the CLI's exit code for usage errors (trtpipe.pipeline.cli.main; runtime/ cannot import it)

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM

log = logging.getLogger("trtpipe.serve")


@dataclass(frozen=True)
class ServeConfig:
    """``trtpipe serve`` options (validated by the CLI)."""

    artifact_dir: Path
    model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_queued_requests: int = 64
    request_timeout_s: float | None = None
    api_key: str | None = None
    shutdown_grace_s: float = 10.0
    num_threads: int | None = None
    # runtime settings of the LLM (see LLM.__init__); the CLI takes them from the recipe
    prefix_caching: bool = True
    scheduler_policy: str = "slo"
    tpot_budget_ms: float | None = None
    itl_budget_ms: float | None = None
    itl_during_prefill_ratio: float | None = None  # steps beside decodes <= this x a decode-only step
    logprobs_mode: str = "raw"  # "raw" | "processed" (vLLM's --logprobs-mode)
    speculative: SpeculativeConfig | None = None  # speculative decoding (runtime/speculative); None = off
    max_queue_wait_ms: float | None = DEFAULT_MAX_QUEUE_WAIT_MS  # None: no predicted-wait admission limit
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies: 413 before parsing
    warm_up: bool = True  # run every shape class before the ready line (--no-warm-up: not)


class _Server(uvicorn.Server):
    """uvicorn with our signal handling: the first signal drains, a second SIGINT forces."""

    on_signal: Callable[[], None] = staticmethod(lambda: None)

    def handle_exit(self, sig, frame) -> None:  # noqa: ANN001 - signal handler signature
        if self.should_exit or getattr(self, "_draining", False):
            if sig == 2:  # SIGINT twice: stop now
                self.force_exit = True
                self.should_exit = True
            return
        self._draining = True
        self.on_signal()


def engine_readings(llm: LLM, engine: EngineLoop) -> Callable[[], dict[str, Any]]:
    """What ``ServeMetrics.bind`` reads at scrape time: gauges from the engine's scheduler and
    block pool, running totals (preemptions, prefix-cache tokens) from the ``LLM``'s counters, and
    speculative decoding's counters (``spec``: None while it is off)."""
    return lambda: {
        "num_requests_running": llm.scheduler.num_running,
        "num_requests_waiting": engine.num_waiting,
        "kv_cache_usage_perc": llm.block_pool.num_used / max(1, llm.block_pool.num_blocks - 1),
        "kv_blocks_in_use": llm.block_pool.num_used,
        "num_preemptions": llm.num_preemptions,
        "prefix_cache_queries": llm.prefix_cache_queries,
        "prefix_cache_hits": llm.prefix_cache_hits,
        "spec": llm.speculation_counters,
    }


def bound_url(server: uvicorn.Server, url: str) -> str:
    """``url`` with the port the server actually listens on (``--port 0`` picks a free one, and
    ``http://127.0.0.1:0`` would tell the user nothing); ``url`` itself before it listens."""
    for srv in getattr(server, "servers", None) or ():
        for sock in srv.sockets:
            port = sock.getsockname()[1]
            return f"{url.rsplit(':', 1)[0]}:{port}"
    return url


def _load(cfg: ServeConfig, state: ServeState, url: str, echo: Callable[[str], None], server: uvicorn.Server) -> None:
    """Load the model and start the engine (a thread, so /health answers meanwhile)."""
    from trtpipe.runtime.llm import LLM

    t = time.perf_counter()
    try:
        llm = LLM(
            cfg.artifact_dir,
            num_threads=cfg.num_threads,
            prefix_caching=cfg.prefix_caching,
            scheduler_policy=cfg.scheduler_policy,
            logprobs_mode=cfg.logprobs_mode,
            speculative=cfg.speculative,
        )
        ready = prepare(
            llm,
            cfg.scheduler_policy,
            cfg.tpot_budget_ms,
            cfg.itl_budget_ms,
            cfg.itl_during_prefill_ratio,
            warm=cfg.warm_up,
        )
    except Exception as e:  # noqa: BLE001 - reported on /health and stderr, server keeps answering 503
        state.load_error = f"loading {cfg.artifact_dir} failed: {e}"
        echo(f"trtpipe serve: error: {state.load_error}")
        return
    limit = "off" if cfg.max_queue_wait_ms is None else f"{cfg.max_queue_wait_ms:g} ms"
    echo(
        f"trtpipe serve: prefix caching {'on' if cfg.prefix_caching else 'off'}; scheduler "
        f"{cfg.scheduler_policy}; prefill chunks: {ready.chunking}; {llm.speculative_description}; admission: 503 + Retry-After past a "
        f"predicted queue wait of {limit} or {cfg.max_queued_requests} waiting requests; request bodies up to "
        f"{cfg.max_request_bytes} bytes"
    )
    state.max_token_bytes = max_token_bytes(llm.tokenizer)
    metrics = ServeMetrics(cfg.model_name)
    engine = EngineLoop(
        llm,
        max_queued_requests=cfg.max_queued_requests,
        request_timeout_s=cfg.request_timeout_s,
        on_finished=metrics.on_finished,
        max_queue_wait_s=None if cfg.max_queue_wait_ms is None else cfg.max_queue_wait_ms / 1e3,
    )
    metrics.bind(engine_readings(llm, engine))
    state.metrics = metrics
    state.engine = engine.start()
    while not server.started and not server.should_exit:  # the ready line means "connect now"
        time.sleep(0.05)
    url = bound_url(server, url)
    echo(
        f"trtpipe serve: ready at {url} (model {cfg.model_name!r}, loaded in "
        f"{time.perf_counter() - t:.1f} s, {ready.ready_detail()}; OpenAI base_url {url}/v1)"
    )


def _announce_listening(
    server: uvicorn.Server, url: str, echo: Callable[[str], None], serving_over: threading.Event
) -> None:
    """Say "listening at" once the socket is bound (with --port 0, the port the OS picked), not
    before: a bind that fails (address in use) then prints only uvicorn's reason and trtpipe's
    error, where a "listening" line printed up front contradicted them."""
    while not server.started:
        if serving_over.wait(0.02):
            return
    echo(f"trtpipe serve: listening at {bound_url(server, url)} (/health answers 503 until the ready line)")


def _never_raising(echo: Callable[[str], None]) -> Callable[[str], None]:
    """``echo`` that drops a line it cannot write: with stderr's reader gone (``serve ... | head``,
    a log collector that died) a write raises BrokenPipeError, which killed the drain thread before
    it stopped the server: SIGINT/SIGTERM then left it up, answering 503, until a second SIGINT."""

    def safe(line: str) -> None:
        try:
            echo(line)
        except (OSError, ValueError):  # BrokenPipeError; ValueError: write to a closed file
            pass

    return safe


def serve(cfg: ServeConfig, echo: Callable[[str], None] | None = None) -> int:
    """Serve until a signal; returns the exit code (0 after a graceful shutdown)."""
    echo = _never_raising(echo or (lambda s: print(s, file=sys.stderr, flush=True)))
    state = ServeState(model_name=cfg.model_name, api_key=cfg.api_key, max_request_bytes=cfg.max_request_bytes)
    # Metrics exist (empty) while loading, so /metrics never 404s.
    state.metrics = ServeMetrics(cfg.model_name)
    app = create_app(state)
    server = _Server(
        uvicorn.Config(
            app, host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5, access_log=False
        )
    )
    url = f"http://{cfg.host}:{cfg.port}"

    def drain() -> None:
        state.draining = True
        try:
            echo(f"trtpipe serve: shutting down (grace {cfg.shutdown_grace_s:g} s for running requests)")
            if state.engine is not None:
                state.engine.shutdown(cfg.shutdown_grace_s)
        finally:  # whatever failed above, the server stops (it stayed up answering 503 otherwise)
            server.should_exit = True

    server.on_signal = lambda: threading.Thread(target=drain, name="trtpipe-drain", daemon=True).start()
    echo(f"trtpipe serve: starting at {url} (loading {cfg.artifact_dir} ...)")
    serving_over = threading.Event()
    threading.Thread(
        target=_announce_listening, args=(server, url, echo, serving_over), name="trtpipe-listen", daemon=True
    ).start()
    threading.Thread(target=_load, args=(cfg, state, url, echo, server), name="trtpipe-load", daemon=True).start()
    try:
        server.run()
    except SystemExit:  # uvicorn exits 3 (its STARTUP_FAILURE, trtpipe's "finish on the target") when bind fails
        if server.started:
            raise
    finally:
        serving_over.set()
    if not server.started:
        echo(
            f"trtpipe serve: error: --host {cfg.host} --port {cfg.port}: could not listen there (uvicorn's "
            "line above says why, e.g. the address is already in use or the host is unknown). Fix: pass a "
            "free --port (0: any free port) or a local --host."
        )
        return EXIT_USAGE
    if state.engine is not None:
        llm = state.engine.llm
        echo(
            f"trtpipe serve: stopped ({llm.block_pool.num_used} KV blocks in use, "
            f"{llm.scheduler.num_running + llm.scheduler.num_waiting} requests left)"
        )
    else:
        echo("trtpipe serve: stopped")
    return 0


__all__ = ["ServeConfig", "serve", "engine_readings", "bound_url"]
