"""The FastAPI app: OpenAI-compatible endpoints over one :class:`EngineLoop`, as a route table.

The handlers are module functions (one module per family under :mod:`.routes`); each reads the
server's state from ``request.app.state.serve`` and makes the shared checks of :mod:`.state`
first. A :class:`~trtpipe.runtime.serve.errors.ServeError` anywhere becomes its OpenAI-style
error body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from trtpipe.runtime.serve.errors import RETRY_AFTER_S, ServeError
from trtpipe.runtime.serve.routes import generation, probes, tokens
from trtpipe.runtime.serve.state import ServeState

ROUTES = (
    # method  path                     handler                       what
    ("GET", "/health", probes.health),  # 200 once loaded; 503 loading, dead, draining
    ("GET", "/metrics", probes.metrics),  # Prometheus, vLLM's names (prefix trtpipe:)
    ("GET", "/v1/models", probes.models),  # the served model and its max_model_len
    ("POST", "/v1/completions", generation.completions),  # prompt text or ids; stream or not
    ("POST", "/v1/chat/completions", generation.chat_completions),  # messages, chat template
    ("POST", "/tokenize", tokens.tokenize),  # vLLM's extra endpoints
    ("POST", "/detokenize", tokens.detokenize),
)


async def _serve_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ServeError)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _http_error(request: Request, e: Exception) -> JSONResponse:
    """An unknown path (404) or a method a path does not take (405), in OpenAI's error shape."""
    assert isinstance(e, HTTPException)
    routes = ", ".join(f"{m} {p}" for m, p, _ in ROUTES)
    message = f"{request.method} {request.url.path}: {e.detail}; expected one of: {routes}."
    body = ServeError(e.status_code, message, type_="invalid_request_error").body()
    return JSONResponse(body, status_code=e.status_code, headers=getattr(e, "headers", None))


def create_app(state: ServeState) -> FastAPI:
    """The ASGI app over ``state`` (its engine may be attached later, once loaded)."""
    app = FastAPI(title="trtpipe", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.add_exception_handler(ServeError, _serve_error)
    app.add_exception_handler(HTTPException, _http_error)
    for method, path, handler in ROUTES:
        app.add_api_route(path, handler, methods=[method])
    return app


__all__ = ["ROUTES", "RETRY_AFTER_S", "ServeState", "create_app"]
