"""What every route shares: the server's state (``request.app.state.serve``) and the checks every
route makes first: the API key and readiness (503 while loading, after the engine died, or while
draining). Rejections are counted in the server's metrics by reason."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from trtpipe.runtime.serve.defaults import DEFAULT_MAX_REQUEST_BYTES
from trtpipe.runtime.serve.engine_loop import EngineLoop
from trtpipe.runtime.serve.errors import RETRY_AFTER_S, ServeError
from trtpipe.runtime.serve.prometheus import ServeMetrics


@dataclass
class ServeState:
    """What the handlers share. ``engine`` is None while the model loads."""

    model_name: str
    api_key: str | None = None
    engine: EngineLoop | None = None
    metrics: ServeMetrics | None = None
    load_error: str | None = None
    draining: bool = False
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # bodies over it: 413 before parsing (--max-request-bytes)
    max_token_bytes: int | None = None  # the longest token's text in bytes (set at load): the prompt bound
    created: int = field(default_factory=lambda: int(time.time()))


def state_of(request: Request) -> ServeState:
    """The server state of the app that received ``request``."""
    return request.app.state.serve


def reject(state: ServeState, reason: str, e: ServeError) -> ServeError:
    """``e``, counted as a rejection for ``reason`` (``bad_request``, ``unauthorized``, ...)."""
    if state.metrics is not None:
        state.metrics.on_rejected(reason)
    return e


def check_auth(request: Request) -> ServeState:
    """The state, after the API key check (401 naming the header and the flag)."""
    state = state_of(request)
    if state.api_key is not None and request.headers.get("authorization", "") != f"Bearer {state.api_key}":
        raise reject(
            state,
            "unauthorized",
            ServeError(
                401,
                "invalid or missing API key: expected the header "
                "'Authorization: Bearer <key>' with the key given to `trtpipe serve --api-key`",
                type_="authentication_error",
                code="invalid_api_key",
            ),
        )
    return state


def ready_engine(request: Request) -> tuple[ServeState, EngineLoop]:
    """The state and its engine loop, after the API key check; 503 with ``Retry-After`` while
    the model loads, after the loop stopped, or while the server drains."""
    state = check_auth(request)
    eng = state.engine
    if state.draining:
        raise reject(
            state,
            "shutting_down",
            ServeError(
                503,
                "the server is shutting down; retry on another replica",
                type_="service_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ),
        )
    if eng is None or not eng.alive:
        why = state.load_error or ("the model is still loading" if eng is None else "the engine loop stopped")
        raise ServeError(
            503, f"not ready: {why}", type_="service_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    return state, eng


__all__ = ["ServeState", "check_auth", "ready_engine", "reject", "state_of"]
