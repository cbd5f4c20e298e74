"""The FastAPI app: OpenAI-compatible endpoints over one :class:`EngineLoop`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (stream and non-stream),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``POST /tokenize``, ``POST /detokenize``.

Each generation request: parse and validate the body (:mod:`.protocol`), tokenize (chat: the model's
template), ``EngineLoop.submit`` with a sink that hands events to this request's own
``asyncio.Queue`` through ``loop.call_soon_threadsafe``, then stream or collect. A client that
leaves is detected from the ASGI connection, as vLLM does: for streams, Starlette's
``StreamingResponse`` listens for ``http.disconnect`` and cancels the generator; for non-streamed
requests the handler races the result against ``request.receive()`` returning
``http.disconnect`` (vLLM's ``with_cancellation``). Either way the ``finally`` cancels the request
in the engine, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from trtpipe.runtime.artifact.chat_template import render_chat
from trtpipe.runtime.errors import RequestError, TrtpipeError
from trtpipe.runtime.sched.request import prompt_length_error
from trtpipe.runtime.serve.engine_loop import Delta, EngineBusy, EngineLoop, Final
from trtpipe.runtime.serve.prometheus import ServeMetrics
from trtpipe.runtime.serve.protocol import (
    GenerationRequest,
    ServeError,
    bad_field,
    parse_add_special_tokens,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from trtpipe.runtime.serve.responses import DONE, ResponseBuilder, error_chunk

RETRY_AFTER_S = 1  # what a 503 tells the client to wait before retrying


@dataclass
class ServeState:
    """What the handlers share. ``engine`` is None while the model loads."""

    model_name: str
    api_key: str | None = None
    engine: EngineLoop | None = None
    metrics: ServeMetrics | None = None
    load_error: str | None = None
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def _error_response(e: ServeError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(state: ServeState) -> FastAPI:
    """The ASGI app over ``state`` (its engine may be attached later, once loaded)."""
    app = FastAPI(title="trtpipe", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    guards = _Guards(state)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> JSONResponse:
        return _error_response(e)

    _add_probe_routes(app, state, guards)
    _add_token_routes(app, state, guards)
    _add_generation_routes(app, state, guards)
    return app


class _Guards:
    """What every route checks first: API key, readiness (503 while loading, dead or draining);
    rejections are counted in the server's metrics by reason."""

    def __init__(self, state: ServeState) -> None:
        self.state = state

    def reject(self, reason: str, e: ServeError) -> ServeError:
        if self.state.metrics is not None:
            self.state.metrics.on_rejected(reason)
        return e

    def engine_or_503(self) -> EngineLoop:
        state = self.state
        eng = state.engine
        if state.draining:
            raise self.reject(
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
        return eng

    def check_auth(self, request: Request) -> None:
        if self.state.api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {self.state.api_key}":
            raise self.reject(
                "unauthorized",
                ServeError(
                    401,
                    "invalid or missing API key: expected the header "
                    "'Authorization: Bearer <key>' with the key given to `trtpipe serve --api-key`",
                    type_="authentication_error",
                    code="invalid_api_key",
                ),
            )


def _add_probe_routes(app: FastAPI, state: ServeState, guards: _Guards) -> None:
    """``/health``, ``/metrics`` and ``/v1/models``."""

    @app.get("/health")
    async def health() -> Response:
        eng = state.engine
        if eng is not None and eng.alive and not state.draining:
            return JSONResponse({"status": "ok"})
        status = "shutting_down" if state.draining else "loading" if eng is None and not state.load_error else "dead"
        return JSONResponse({"status": status, "error": state.load_error or (eng and repr(eng.error))}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = state.metrics.render() if state.metrics is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        guards.check_auth(request)
        eng = state.engine
        max_len = eng.llm.manifest.limits["max_seq_len"] if eng is not None else None
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


def _add_token_routes(app: FastAPI, state: ServeState, guards: _Guards) -> None:
    """``/tokenize`` and ``/detokenize`` (vLLM's extra endpoints)."""

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        guards.check_auth(request)
        eng = guards.engine_or_503()
        doc = parse_json_body(await request.body())
        add_special_tokens = parse_add_special_tokens(doc)
        if "messages" in doc:
            chat = parse_chat({**doc, "model": state.model_name}, (state.model_name,))
            ids = _encode_chat(eng, chat, add_special_tokens=add_special_tokens)
        else:
            prompt = doc.get("prompt")
            if not isinstance(prompt, str):
                raise bad_field("prompt", prompt, "a string", 'send {"prompt": "text"}')
            ids = eng.llm.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": eng.llm.manifest.limits["max_seq_len"]})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        guards.check_auth(request)
        eng = guards.engine_or_503()
        doc = parse_json_body(await request.body())
        ids = doc.get("tokens")
        vocab = eng.llm.tokenizer.vocab_size
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
        ):
            raise bad_field("tokens", ids, f"a list of token ids in [0, {vocab})", 'send {"tokens": [1, 2]}')
        return JSONResponse({"prompt": eng.llm.tokenizer.backend.decode(ids, skip_special_tokens=False)})


def _add_generation_routes(app: FastAPI, state: ServeState, guards: _Guards) -> None:
    """``/v1/completions`` and ``/v1/chat/completions`` (streaming or not)."""

    async def generate(request: Request, kind: str) -> Response:
        guards.check_auth(request)
        eng = guards.engine_or_503()
        try:
            doc = parse_json_body(await request.body())
            served = (state.model_name,)
            req = parse_completion(doc, served) if kind == "completion" else parse_chat(doc, served)
            ids = _encode_chat(eng, req) if kind == "chat" else _encode_prompt(eng, req)
            params = req.sampling_params(_max_new_tokens(eng, req, ids))
        except ServeError as e:
            raise guards.reject("bad_request", e) from e
        except RequestError as e:
            field_name = "messages" if kind == "chat" else "prompt"
            raise guards.reject("bad_request", ServeError(400, str(e), param=field_name)) from e
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event: Any) -> None:  # engine thread -> this request's queue
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the event loop is closed (server exiting): nobody listens
                pass

        try:
            rid = eng.submit(ids, params, sink, cache_salt=req.cache_salt)
        except EngineBusy as e:
            raise guards.reject(
                e.reason,
                ServeError(
                    503,
                    f"overloaded: {e}; retry after {RETRY_AFTER_S} s",
                    type_="service_unavailable",
                    code=e.reason,
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                ),
            ) from e
        builder = ResponseBuilder(req, tuple(ids))
        if req.stream:
            return StreamingResponse(
                _stream(eng, rid, events, builder),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _collect(request, eng, rid, events, builder)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")


# -- per request ------------------------------------------------------------------------------


def _encode_prompt(eng: EngineLoop, req: GenerationRequest) -> list[int]:
    if isinstance(req.prompt, tuple):
        vocab = eng.llm.tokenizer.vocab_size
        if max(req.prompt) >= vocab:
            raise bad_field(
                "prompt", list(req.prompt), f"token ids in [0, {vocab})", "send ids of this model's vocabulary"
            )
        return list(req.prompt)
    return eng.llm.encode_prompt(req.prompt)


def _encode_chat(eng: EngineLoop, req: GenerationRequest, *, add_special_tokens: bool = True) -> list[int]:
    """The chat template of the model applied to ``messages``, tokenized as ``LLM.encode_prompt``
    does for ``chat=True`` (so a chat request equals ``LLM.generate(..., chat=True)``);
    ``add_special_tokens`` is /tokenize's field (generation always adds them)."""
    tpl = eng.llm.manifest.model.chat_template
    if not tpl:
        raise ServeError(
            400,
            "messages: this model has no chat template in its metadata; expected a "
            "model with one. Fix: use /v1/completions with a plain prompt.",
            param="messages",
        )
    try:
        text = render_chat(tpl, [dict(m) for m in req.messages or ()])
    except TrtpipeError as e:
        raise ServeError(400, str(e), param="messages") from None
    return eng.llm.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _max_new_tokens(eng: EngineLoop, req: GenerationRequest, ids: list[int]) -> int:
    """``max_tokens``, or when unset everything up to max_seq_len (chat) or OpenAI's default 16
    capped to what fits (completions, as vLLM does). 400 ``context_length_exceeded`` when the
    prompt leaves no room, or when the client's max_tokens does not fit beside the prompt (vLLM's
    and OpenAI's refusal, naming the field, the value and the most that fits)."""
    max_len = eng.llm.manifest.limits["max_seq_len"]
    field_name = "messages" if req.kind == "chat" else "prompt"
    too_long = prompt_length_error(len(ids), max_len)
    if too_long is not None:
        raise ServeError(400, f"{field_name}: the {too_long}", param=field_name, code="context_length_exceeded")
    room = max_len - len(ids)
    if req.max_tokens is None:
        return room
    if req.max_tokens <= room or req.max_tokens_param is None:
        return min(req.max_tokens, room)
    param = req.max_tokens_param
    drop = f", or drop {param} (chat then generates up to the context length)" if req.kind == "chat" else ""
    shorter = "shorter messages" if req.kind == "chat" else "a shorter prompt"
    raise ServeError(
        400,
        f"{param} = {req.max_tokens}: this model's maximum context length is {max_len} tokens. However, "
        f"you requested {len(ids) + req.max_tokens} tokens ({len(ids)} in the {field_name}, "
        f"{req.max_tokens} in the completion); expected {param} <= {room}. Fix: send {param} <= {room}, "
        f"or {shorter}{drop}.",
        param=param,
        code="context_length_exceeded",
    )


async def _stream(eng: EngineLoop, rid: str, events: asyncio.Queue, b: ResponseBuilder) -> AsyncIterator[bytes]:
    """SSE chunks until the Final event. Cancelled by Starlette when the client disconnects; the
    ``finally`` then aborts the request in the engine (KV freed before the next step)."""
    finished = False
    num_ids = 0
    try:
        first = True
        if b.req.kind == "chat":
            yield b.chunk("", first=True)
            first = False
        while True:
            event = await events.get()
            if isinstance(event, Delta):
                num_ids += len(event.token_ids)
                if event.text or b.req.return_token_ids:
                    yield b.chunk(event.text, event.token_ids, first=first)
                    first = False
                continue
            assert isinstance(event, Final)
            finished = True
            out = event.output
            if out.finish_reason == "error":
                yield error_chunk(out.error_message or "engine error")
            else:
                yield b.chunk("", finish_reason=out.finish_reason, first=first)
                if b.req.include_usage:
                    yield b.usage_chunk(len(out.output_token_ids), out.cached_tokens)
            yield DONE
            return
    finally:
        if not finished:
            eng.cancel(rid)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(request: Request, eng: EngineLoop, rid: str, events: asyncio.Queue, b: ResponseBuilder) -> Response:
    """Gather the whole output, or abort the request if the client disconnects first."""

    async def result() -> Final:
        while True:
            event = await events.get()
            if isinstance(event, Final):
                return event

    task = asyncio.ensure_future(result())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            eng.cancel(rid)
    if task not in done:
        return Response(status_code=499)  # client closed the request (nobody reads this)
    out = task.result().output
    if out.finish_reason == "error":
        raise ServeError(500, f"engine error: {out.error_message}", type_="server_error")
    return JSONResponse(b.full(out.text, out.output_token_ids, out.finish_reason, out.cached_tokens))


__all__ = ["ServeState", "create_app", "RETRY_AFTER_S"]
