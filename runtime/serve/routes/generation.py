"""``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming or not, ``n`` choices).

One path per request::

    body ──parse (protocol: OpenAI's fields)──► GenerationRequest ──encode (a worker thread past
         1 KiB of text)──► prompt ids
         ──LLM.new_requests (the one check: prompt, length, sampling; a schema compiled, cached by
           hash, in a worker thread: never on the event loop)──► n Requests (choice i: seed + i)
         ──EngineLoop.submit──► engine thread ──(choice index, event)──► this request's asyncio.Queue
         ──► SSE chunks (stream) or one JSON body

A client that leaves is detected from the ASGI connection, as vLLM does: for streams,
Starlette's ``StreamingResponse`` listens for ``http.disconnect`` and cancels the generator; for
non-streamed requests the handler races the result against ``request.receive()`` returning
``http.disconnect`` (vLLM's ``with_cancellation``). Either way the ``finally`` cancels every
unfinished choice in the engine, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.llm import LLM
from trtpipe.runtime.sched.request import Request as RuntimeRequest
from trtpipe.runtime.serve.engine_loop import Delta, EngineLoop, Final
from trtpipe.runtime.serve.errors import EngineBusy, ServeError, busy_error, from_request_error
from trtpipe.runtime.serve.first_token_path import HandlerStamps, first_token_path_s
from trtpipe.runtime.serve.protocol import (
    GenerationRequest,
    max_new_tokens,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from trtpipe.runtime.serve.protocol.limits import (
    FAST_PATH_BYTES,
    check_prompt_bytes,
    raw_prompt_bytes,
    read_body,
    text_bytes,
)
from trtpipe.runtime.serve.responses import DONE, Choice, ResponseBuilder, error_chunk, prompt_logprob_records
from trtpipe.runtime.serve.state import ServeState, ready_engine, reject

# Prompts up to this many bytes of text are tokenized on the event loop: SmolLM2's tokenizer takes
# 0.07 ms for 57 bytes and ~1.3 ms for 1 KiB (chat: + ~0.6 ms of template) on a 2-core Zen 3, less
# than or about the worker-thread hand-off it saves (the "tokenize" stage: 0.5-0.7 ms mean through
# the executor); longer prompts go to a worker so the loop never stalls the other streams.
INLINE_ENCODE_BYTES = 1024


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


async def _checked(
    request: Request,
    state: ServeState,
    eng: EngineLoop,
    parse: Callable[[dict, tuple[str, ...]], GenerationRequest],
    encode: Callable[[LLM, GenerationRequest], list[int]],
    prompt_field: str,
    stamps: HandlerStamps,
) -> tuple[GenerationRequest, list[int], list[RuntimeRequest]]:
    """Parse, encode and check; the n runtime requests. 413 for a body over the limit, 400 for
    anything refused (both counted); the byte bound before tokenizing, which runs in a worker thread
    past ``INLINE_ENCODE_BYTES``.
    Stamps ``parsed_s`` and ``encoded_s``."""
    loop = asyncio.get_running_loop()
    limit = eng.llm.manifest.limits.max_seq_len
    try:
        raw = await read_body(request, state.max_request_bytes)
        if len(raw) > FAST_PATH_BYTES and prompt_field == "prompt" and (num := raw_prompt_bytes(raw)) is not None:
            check_prompt_bytes(num, state.max_token_bytes, limit, prompt_field)  # a huge prompt: no json.loads
        req = parse(parse_json_body(raw), (state.model_name,))
        if req.ignored_fields and state.metrics is not None:
            state.metrics.on_ignored_fields(req.ignored_fields)
        texts = [req.prompt] if isinstance(req.prompt, str) else []
        texts += [str(m.get("content", "")) for m in req.messages or ()]
        check_prompt_bytes(text_bytes(texts), state.max_token_bytes, limit, prompt_field)
        stamps.parsed_s = time.monotonic()
        if text_bytes(texts) <= INLINE_ENCODE_BYTES:  # cheaper than the hop to a worker thread
            ids = encode(eng.llm, req)
        else:
            ids = await loop.run_in_executor(None, encode, eng.llm, req)
        stamps.encoded_s = time.monotonic()
        num_new = max_new_tokens(req, len(ids), limit, prompt_field)
        make = functools.partial(
            eng.llm.new_requests,
            ids,
            [req.sampling_params(num_new, i) for i in range(req.n)],
            cache_salt=req.cache_salt,
        )
        # a schema is compiled (llguidance, up to ~1 s for a large one) in a worker thread
        news = await loop.run_in_executor(None, make) if req.structured else make()
    except ServeError as e:
        raise reject(state, "too_large" if e.status == 413 else "bad_request", e) from e
    except RequestError as e:
        raise reject(state, "bad_request", from_request_error(e, prompt_field)) from e
    return req, ids, news


async def _generate(
    request: Request,
    parse: Callable[[dict, tuple[str, ...]], GenerationRequest],
    encode: Callable[[LLM, GenerationRequest], list[int]],
    prompt_field: str,
) -> Response:
    stamps = HandlerStamps.now()
    state, eng = ready_engine(request)
    req, ids, news = await _checked(request, state, eng, parse, encode, prompt_field, stamps)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def sink_of(index: int) -> Callable[[Any], None]:
        def sink(event: Any) -> None:  # engine thread -> this request's queue
            try:
                loop.call_soon_threadsafe(events.put_nowait, (index, event))
            except RuntimeError:  # the event loop is closed (server exiting): nobody listens
                pass

        return sink

    rids: list[str] = []
    stamps.submitted_s = time.monotonic()  # before the engine thread can take it: one causal order
    try:
        for i, new in enumerate(news):
            rids.append(eng.submit(new, sink_of(i)))
    except EngineBusy as e:
        for rid in rids:
            eng.cancel(rid)
        raise reject(state, e.reason, busy_error(e)) from e
    builder = ResponseBuilder(req, tuple(ids), eng.llm.tokenizer.token_bytes)
    decode = functools.partial(eng.llm.tokenizer.decode, ids, skip_special_tokens=False)
    echo = await loop.run_in_executor(None, decode) if req.echo else ""
    if req.stream:
        observe = state.metrics.on_first_token_path if state.metrics is not None else None
        stream = _stream(eng, rids, events, builder, echo, (stamps, observe))
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(request, eng, rids, events, builder, echo)


async def _stream(
    eng: EngineLoop,
    rids: list[str],
    events: asyncio.Queue,
    b: ResponseBuilder,
    echo: str,
    timing: tuple[HandlerStamps, Callable[[dict[str, float]], None] | None],
) -> AsyncIterator[bytes]:
    """SSE chunks until every choice's Final event. Cancelled by Starlette when the client
    disconnects; the ``finally`` then aborts the unfinished choices (KV freed before the next step).
    Once the first chunk with tokens is written (the generator resumes after Starlette's send),
    its first-token stages go to ``timing``'s observer."""
    done: dict[int, Any] = {}
    echo_lp = bool(echo) and b.req.logprobs is not None  # the echo chunk waits for the prompt's logprobs
    prompt_records = None
    try:
        first = set(range(len(rids)))
        for i in range(len(rids)):
            if b.req.kind == "chat" or (echo and not echo_lp):
                yield b.chunk(echo, first=True, index=i)
                first.discard(i)
        while len(done) < len(rids):
            i, event = await events.get()
            if isinstance(event, Delta):
                if event.prompt_logprobs is not None and prompt_records is None:
                    prompt_records = prompt_logprob_records(b.prompt_token_ids, event.prompt_logprobs)
                if echo_lp and i in first:
                    yield b.chunk(echo, first=True, index=i, logprobs=prompt_records)
                    first.discard(i)
                if event.text or event.token_ids:
                    yield b.chunk(event.text, event.token_ids, first=i in first, index=i, logprobs=event.logprobs)
                    first.discard(i)
                    if i == 0 and event.stamps is not None and timing[1] is not None:
                        timing[1](first_token_path_s(timing[0], event.stamps, time.monotonic()))
                continue
            assert isinstance(event, Final)
            done[i] = out = event.output
            if out.finish_reason == "error":
                yield error_chunk(out.error_message or "engine error")
                yield DONE
                return
            yield b.chunk("", finish_reason=out.finish_reason, first=i in first, index=i)
        if b.req.include_usage:
            yield b.usage_chunk(sum(len(o.output_token_ids) for o in done.values()), done[0].cached_tokens)
        yield DONE
    finally:
        for i, rid in enumerate(rids):
            if i not in done:
                eng.cancel(rid)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    request: Request, eng: EngineLoop, rids: list[str], events: asyncio.Queue, b: ResponseBuilder, echo: str
) -> Response:
    """Gather every choice's output, or abort them all if the client disconnects first."""
    finals: dict[int, Any] = {}

    async def result() -> None:
        while len(finals) < len(rids):
            i, event = await events.get()
            if isinstance(event, Final):
                finals[i] = event.output

    task = asyncio.ensure_future(result())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            for i, rid in enumerate(rids):
                if i not in finals:
                    eng.cancel(rid)
    if task not in done:
        return Response(status_code=499)  # client closed the request (nobody reads this)
    outs = [finals[i] for i in range(len(rids))]
    failed = next((o for o in outs if o.finish_reason == "error"), None)
    if failed is not None:
        raise ServeError(500, f"engine error: {failed.error_message}", type_="server_error")
    prompt_records: list = []
    if echo and b.req.logprobs is not None:  # every choice shares the first one's prompt
        prompt_records = prompt_logprob_records(b.prompt_token_ids, outs[0].prompt_logprobs or ())
    choices = [
        Choice(
            i,
            echo + o.text,
            o.output_token_ids,
            o.finish_reason,
            None if o.logprobs is None else prompt_records + o.logprobs,
        )
        for i, o in enumerate(outs)
    ]
    return JSONResponse(b.full(choices, outs[0].cached_tokens))
