"""``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming or not).

One path per request::

    body ──parse (protocol: OpenAI's fields)──► GenerationRequest ──encode──► prompt ids
         ──LLM.new_request (the one check: prompt, length, sampling)──► Request
         ──EngineLoop.submit──► engine thread ──events──► this request's asyncio.Queue
         ──► SSE chunks (stream) or one JSON body

A client that leaves is detected from the ASGI connection, as vLLM does: for streams,
Starlette's ``StreamingResponse`` listens for ``http.disconnect`` and cancels the generator; for
non-streamed requests the handler races the result against ``request.receive()`` returning
``http.disconnect`` (vLLM's ``with_cancellation``). Either way the ``finally`` cancels the request
in the engine, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.llm import LLM
from trtpipe.runtime.serve.engine_loop import Delta, EngineLoop, Final
from trtpipe.runtime.serve.errors import EngineBusy, ServeError, busy_error, from_request_error
from trtpipe.runtime.serve.protocol import (
    GenerationRequest,
    max_new_tokens,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from trtpipe.runtime.serve.responses import DONE, ResponseBuilder, error_chunk
from trtpipe.runtime.serve.state import ready_engine, reject


async def completions(request: Request) -> Response:
    """OpenAI's completions: ``prompt`` as text or token ids."""
    return await _generate(request, parse_completion, _completion_ids, "prompt")


async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completions: ``messages`` under the model's chat template (``LLM.encode_chat``)."""
    return await _generate(request, parse_chat, _chat_ids, "messages")


def _completion_ids(llm: LLM, req: GenerationRequest) -> list[int]:
    return list(req.prompt) if isinstance(req.prompt, tuple) else llm.encode_prompt(req.prompt)


def _chat_ids(llm: LLM, req: GenerationRequest) -> list[int]:
    return llm.encode_chat([dict(m) for m in req.messages or ()])


async def _generate(
    request: Request,
    parse: Callable[[dict, tuple[str, ...]], GenerationRequest],
    encode: Callable[[LLM, GenerationRequest], list[int]],
    prompt_field: str,
) -> Response:
    state, eng = ready_engine(request)
    try:
        req = parse(parse_json_body(await request.body()), (state.model_name,))
        ids = encode(eng.llm, req)
        limit = eng.llm.manifest.limits.max_seq_len
        params = req.sampling_params(max_new_tokens(req, len(ids), limit, prompt_field))
        new = eng.llm.new_request(ids, params, cache_salt=req.cache_salt)
    except ServeError as e:
        raise reject(state, "bad_request", e) from e
    except RequestError as e:
        raise reject(state, "bad_request", from_request_error(e, prompt_field)) from e
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def sink(event: Any) -> None:  # engine thread -> this request's queue
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (server exiting): nobody listens
            pass

    try:
        rid = eng.submit(new, sink)
    except EngineBusy as e:
        raise reject(state, e.reason, busy_error(e)) from e
    builder = ResponseBuilder(req, tuple(ids))
    if req.stream:
        return StreamingResponse(
            _stream(eng, rid, events, builder), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    return await _collect(request, eng, rid, events, builder)


async def _stream(eng: EngineLoop, rid: str, events: asyncio.Queue, b: ResponseBuilder) -> AsyncIterator[bytes]:
    """SSE chunks until the Final event. Cancelled by Starlette when the client disconnects; the
    ``finally`` then aborts the request in the engine (KV freed before the next step)."""
    finished = False
    try:
        first = True
        if b.req.kind == "chat":
            yield b.chunk("", first=True)
            first = False
        while True:
            event = await events.get()
            if isinstance(event, Delta):
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
