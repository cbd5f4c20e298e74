"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extra endpoints)."""

from __future__ import annotations

import asyncio
import functools

from fastapi import Request
from fastapi.responses import JSONResponse

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.serve.errors import bad_field, from_request_error
from trtpipe.runtime.serve.protocol import parse_add_special_tokens, parse_chat, parse_json_body
from trtpipe.runtime.serve.protocol.limits import read_body
from trtpipe.runtime.serve.state import ready_engine


async def tokenize(request: Request) -> JSONResponse:
    """Token ids of ``prompt`` (text), or of ``messages`` under the model's chat template (in a
    worker thread: a long text takes a second to tokenize; the body limit still applies)."""
    state, eng = ready_engine(request)
    doc = parse_json_body(await read_body(request, state.max_request_bytes))
    add_special_tokens = parse_add_special_tokens(doc)
    llm = eng.llm
    run = asyncio.get_running_loop().run_in_executor
    if "messages" in doc:
        chat = parse_chat({**doc, "model": state.model_name}, (state.model_name,))
        messages = [dict(m) for m in chat.messages or ()]
        try:
            ids = await run(None, functools.partial(llm.encode_chat, messages, add_special_tokens=add_special_tokens))
        except RequestError as e:
            raise from_request_error(e, "messages") from None
    else:
        prompt = doc.get("prompt")
        if not isinstance(prompt, str):
            raise bad_field("prompt", prompt, "a string", 'send {"prompt": "text"}')
        ids = await run(None, functools.partial(llm.tokenizer.encode, prompt, add_special_tokens=add_special_tokens))
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": llm.manifest.limits.max_seq_len})


async def detokenize(request: Request) -> JSONResponse:
    """The text of ``tokens`` (special tokens kept)."""
    state, eng = ready_engine(request)
    doc = parse_json_body(await read_body(request, state.max_request_bytes))
    ids = doc.get("tokens")
    vocab = eng.llm.tokenizer.vocab_size
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
    ):
        raise bad_field("tokens", ids, f"a list of token ids in [0, {vocab})", 'send {"tokens": [1, 2]}')
    decode = functools.partial(eng.llm.tokenizer.backend.decode, ids, skip_special_tokens=False)
    return JSONResponse({"prompt": await asyncio.get_running_loop().run_in_executor(None, decode)})
