"""``GET /health``, ``GET /metrics`` and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from trtpipe.runtime.serve.state import check_auth, state_of


async def health(request: Request) -> Response:
    """200 ``{"status": "ok"}`` once the engine runs; 503 with ``loading``, ``dead`` or
    ``shutting_down`` (and the error) otherwise."""
    state = state_of(request)
    eng = state.engine
    if eng is not None and eng.alive and not state.draining:
        return JSONResponse({"status": "ok"})
    status = "shutting_down" if state.draining else "loading" if eng is None and not state.load_error else "dead"
    return JSONResponse({"status": status, "error": state.load_error or (eng and repr(eng.error))}, status_code=503)


async def metrics(request: Request) -> Response:
    """The Prometheus exposition (text format 0.0.4)."""
    state = state_of(request)
    body = state.metrics.render() if state.metrics is not None else b""
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def models(request: Request) -> JSONResponse:
    """The one served model, with its context length (``max_model_len``, vLLM's field)."""
    state = check_auth(request)
    eng = state.engine
    max_len = eng.llm.manifest.limits.max_seq_len if eng is not None else None
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "trtpipe",
                    "max_model_len": max_len,
                }
            ],
        }
    )
