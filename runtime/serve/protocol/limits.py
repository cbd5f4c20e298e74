"""Size limits checked before the expensive work, so no request can stall the others.

    body bytes   > --max-request-bytes                     ─► 413, before the body is parsed
                   (Content-Length checked before reading; a chunked body counted while read)
    prompt bytes >= max_seq_len x max_token_bytes           ─► 400 context_length_exceeded,
                                                              before tokenizing or rendering
    otherwise: tokenize / render the chat template in a worker thread, then the exact check

The byte bound: no token of the model stands for more than ``max_token_bytes`` bytes of text
(:func:`max_token_bytes`: the longest token of the vocabulary, special tokens included), so a text
of B bytes needs at least ceil(B / max_token_bytes) tokens, and a prompt that needs max_seq_len
tokens or more is refused anyway. A tokenizer with a normalizer (which might shrink text, e.g.
NFKC folds a 3-byte fullwidth letter to 1 byte) gets the bound x 4, the most UTF-8 can shrink a
character. SmolLM2: 81 bytes, so 2048 tokens cannot need more than 165,888 bytes.

Measured on the 2-core AMD EPYC Zen 4 host: tokenizing 0.9 MB of text takes 1.05 s, and even in a
worker thread it held the interpreter lock for up to 77 ms at a time; ``json.loads`` of a 10 MB
body takes 12 ms (18 MB of escaped text: 58 ms). So the body limit bounds the parse, and the byte
bound keeps long texts away from the tokenizer.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request

from trtpipe.runtime.serve.errors import ServeError

NORMALIZER_SHRINK = 4  # the most a normalizer can shrink a character in UTF-8 (4 bytes -> 1)
FAST_PATH_BYTES = 1 << 20  # bodies above this try raw_prompt_bytes before json.loads
FAST_PATH_PREFIX_BYTES = 1 << 16  # the "prompt" key must start within this many bytes
FAST_PATH_MAX_HOPS = 10_000  # escaped quotes skipped looking for the end of the prompt string


def max_token_bytes(tokenizer: Any) -> int:
    """Bytes of text the longest token of ``tokenizer`` (a :class:`~trtpipe.runtime.artifact.tokenizer.Tokenizer`)
    stands for, x ``NORMALIZER_SHRINK`` when it normalizes text (module doc). ~0.35 s for 49k tokens."""
    longest = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
    return max(1, longest) * (NORMALIZER_SHRINK if tokenizer.backend.normalizer is not None else 1)


def body_too_large(num_bytes: int | str, limit: int) -> ServeError:
    """413 naming the size, the limit and both fixes."""
    return ServeError(
        413,
        f"request body: {num_bytes} bytes is over the server's limit of {limit} bytes; expected at most {limit} "
        "bytes. Fix: send a shorter prompt, or start the server with a larger --max-request-bytes.",
        param="body",
        code="request_too_large",
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; :func:`body_too_large` (413) as soon as it is
    known to be longer: from ``Content-Length`` before reading, else while reading."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise body_too_large(declared, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def text_bytes(texts: list[str]) -> int:
    """UTF-8 bytes of ``texts`` (the prompt, or every message's content)."""
    return sum(len(t.encode("utf-8", errors="surrogatepass")) for t in texts)


def raw_prompt_bytes(raw: bytes) -> int | None:
    """A lower bound on the UTF-8 bytes of the top-level ``"prompt"`` string of the JSON body
    ``raw``, found without parsing the body (so a 10 MB prompt is refused without the ~15-40 ms
    ``json.loads`` would hold the event loop for); None when it cannot tell cheaply (no such key
    within the first FAST_PATH_PREFIX_BYTES, a key nested in another object, a prompt that is not
    one string, too many escaped quotes). The string's raw span has no unescaped quote; every
    escape sequence starts with a backslash and stands for at least 1 byte of the 6 it may take,
    so the text holds at least ``len(span) - 5 x backslashes`` bytes."""
    key = raw.find(b'"prompt"', 0, FAST_PATH_PREFIX_BYTES)
    if key < 0:
        return None
    head = raw[:key].rstrip()
    try:  # the key sits at the top level when what precedes it is the start of one object
        if not isinstance(json.loads(head[:-1] + b"}" if head.endswith(b",") else head + b"}"), dict):
            return None
    except ValueError:
        return None
    colon = raw.find(b":", key + 8, key + 64)
    start = colon + 1
    while start < len(raw) and raw[start : start + 1] in b" \t\r\n":
        start += 1
    if colon < 0 or raw[start : start + 1] != b'"':
        return None
    end = start
    for _ in range(FAST_PATH_MAX_HOPS):
        end = raw.find(b'"', end + 1)
        if end < 0:
            return None
        before = end - 1
        while raw[before] == 0x5C:  # a backslash: this quote is escaped when an odd number precede it
            before -= 1
        if (end - 1 - before) % 2 == 0:
            span = raw[start + 1 : end]
            return max(0, len(span) - 5 * span.count(b"\\"))
    return None


def check_prompt_bytes(num_bytes: int, token_bytes: int | None, max_seq_len: int, field: str) -> None:
    """400 ``context_length_exceeded`` when a prompt of ``num_bytes`` bytes of text (the prompt,
    or every message's content: :func:`text_bytes`) needs max_seq_len tokens or more (module
    doc); nothing when ``token_bytes`` is None (unknown yet)."""
    if token_bytes is None:
        return
    min_tokens = math.ceil(num_bytes / token_bytes)
    if min_tokens >= max_seq_len:
        raise ServeError(
            400,
            f"{field}: {num_bytes} bytes of text need at least {min_tokens} tokens (no token of this model stands for "
            f"more than {token_bytes} bytes), but this model's maximum context length is {max_seq_len} tokens; "
            f"refused before tokenizing. Fix: shorten the prompt to well under {max_seq_len * token_bytes} bytes "
            f"(about {max_seq_len} tokens; POST /tokenize counts them).",
            param=field,
            code="context_length_exceeded",
        )


__all__ = [
    "FAST_PATH_BYTES",
    "NORMALIZER_SHRINK",
    "body_too_large",
    "check_prompt_bytes",
    "max_token_bytes",
    "raw_prompt_bytes",
    "read_body",
    "text_bytes",
]
