"""OpenAI response bodies and Server-Sent Events chunks, built from engine events.

Shapes follow the OpenAI API reference (``text_completion``, ``chat.completion``,
``chat.completion.chunk``) and vLLM's id fields: ``prompt_token_ids`` (top level) and
``token_ids`` (per choice, per stream delta) when the request asked ``return_token_ids``. Text
fields only ever hold detokenizer text; ids only ever sit in the id fields. With ``n`` > 1 every
choice has its ``index``; ``usage.completion_tokens`` counts the tokens of every choice, the
prompt once (OpenAI's and vLLM's rule).

Logprobs (natural log), as OpenAI returns them::

    chat:        choices[i].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
                                        [{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}
    completions: choices[i].logprobs = {"tokens": [...], "token_logprobs": [...],
                                        "top_logprobs": [{token: logprob, ...}, ...], "text_offset": [...]}

``bytes`` are the token's exact bytes; ``token`` is them decoded as UTF-8 with U+FFFD for a
token that ends inside a character (its ``bytes`` still carry the partial character).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trtpipe.runtime.sample.logprobs import TokenLogprobs
from trtpipe.runtime.serve.protocol import GenerationRequest


def sse(doc: dict | str) -> bytes:
    """One SSE event: ``data: <json>\\n\\n`` (UTF-8, non-ASCII kept as is)."""
    data = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


@dataclass(frozen=True)
class Choice:
    """One finished choice: its text (the prompt's first under ``echo``), ids, reason, logprobs."""

    index: int
    text: str
    token_ids: Sequence[int]
    finish_reason: str | None
    logprobs: Sequence[TokenLogprobs] | None = None


@dataclass
class ResponseBuilder:
    """Builds the bodies of one request (its id and creation time are fixed at construction).

    ``token_bytes``: token id -> its bytes (``Tokenizer.token_bytes``), for logprobs.
    """

    req: GenerationRequest
    prompt_token_ids: tuple[int, ...]
    token_bytes: Callable[[int], bytes] = lambda t: b""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _bytes: dict[int, bytes] = field(default_factory=dict)  # bytes of each choice's tokens so far

    @property
    def _chat(self) -> bool:
        return self.req.kind == "chat"

    def _head(self, chunk: bool) -> dict:
        if self._chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
            return {"id": f"chatcmpl-{self.id}", "object": obj, "created": self.created, "model": self.req.model}
        return {"id": f"cmpl-{self.id}", "object": "text_completion", "created": self.created, "model": self.req.model}

    def usage(self, num_output_tokens: int, cached_tokens: int = 0) -> dict:
        """OpenAI's usage object; ``num_output_tokens``: all choices together;
        ``prompt_tokens_details.cached_tokens``: prompt tokens whose KV came from the prefix cache
        (a multiple of the KV block size; 0 on a miss)."""
        n = len(self.prompt_token_ids)
        return {
            "prompt_tokens": n,
            "completion_tokens": num_output_tokens,
            "total_tokens": n + num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }

    def full(self, choices: Sequence[Choice], cached_tokens: int = 0) -> dict:
        """The non-streaming response."""
        docs = []
        for c in choices:
            doc: dict = {
                "index": c.index,
                "finish_reason": c.finish_reason,
                "logprobs": self._logprobs(c.index, c.logprobs),
            }
            if self._chat:
                doc["message"] = {"role": "assistant", "content": c.text}
            else:
                doc["text"] = c.text
            if self.req.return_token_ids:
                doc["token_ids"] = list(c.token_ids)
            docs.append(doc)
        used = sum(len(c.token_ids) for c in choices)
        out = {**self._head(False), "choices": docs, "usage": self.usage(used, cached_tokens)}
        if self.req.return_token_ids:
            out["prompt_token_ids"] = list(self.prompt_token_ids)
        return out

    def chunk(
        self,
        text: str,
        token_ids: Sequence[int] = (),
        finish_reason: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: Sequence[TokenLogprobs] | None = None,
    ) -> bytes:
        """One streamed chunk of choice ``index``: a text delta (chat: ``delta.content``; the first
        chat chunk also carries ``role``), its token ids when asked, its tokens' logprobs, and the
        finish reason on the last one."""
        choice: dict = {"index": index, "finish_reason": finish_reason, "logprobs": self._logprobs(index, logprobs)}
        if self._chat:
            delta: dict = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        if self.req.return_token_ids:
            choice["token_ids"] = list(token_ids)
        doc = {**self._head(True), "choices": [choice]}
        if first and self.req.return_token_ids:
            doc["prompt_token_ids"] = list(self.prompt_token_ids)
        return sse(doc)

    def usage_chunk(self, num_output_tokens: int, cached_tokens: int = 0) -> bytes:
        """The last chunk before ``[DONE]`` when ``stream_options.include_usage``: no choices."""
        return sse({**self._head(True), "choices": [], "usage": self.usage(num_output_tokens, cached_tokens)})

    # -- logprobs ------------------------------------------------------------------------------
    def _entry(self, token_id: int, logprob: float) -> tuple[str, float, list[int]]:
        raw = self.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), _finite(logprob), list(raw)

    def _logprobs(self, index: int, records: Sequence[TokenLogprobs] | None) -> dict | None:
        """The ``logprobs`` object of some tokens of choice ``index`` (None when not asked)."""
        if records is None or self.req.logprobs is None:
            return None
        if self._chat:
            content = []
            for r in records:
                tok, lp, raw = self._entry(r.token_id, r.logprob)
                alts = [
                    dict(zip(("token", "logprob", "bytes"), self._entry(i, v)))
                    for i, v in zip(r.top_ids, r.top_logprobs)
                ]
                content.append({"token": tok, "logprob": lp, "bytes": raw, "top_logprobs": alts})
            return {"content": content, "refusal": None}
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for r in records:
            tok, lp, raw = self._entry(r.token_id, r.logprob)
            so_far = self._bytes.get(index, b"")
            offsets.append(len(so_far.decode("utf-8", errors="ignore")))
            self._bytes[index] = so_far + bytes(raw)
            tokens.append(tok)
            if math.isnan(r.logprob):  # echo: the prompt's first token has none
                values.append(None)
                tops.append(None)
                continue
            values.append(lp)
            top: dict[str, float] = {}
            for i, v in zip(r.top_ids, r.top_logprobs):
                top.setdefault(self._entry(i, v)[0], _finite(v))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprob_records(prompt_ids: Sequence[int], records: Sequence[TokenLogprobs | None]) -> list[TokenLogprobs]:
    """The prompt's records for ``echo`` with ``logprobs``: the first token (no logprob: NaN,
    sent as null) then one per later prompt token (``RequestOutput.prompt_logprobs``)."""
    head = [TokenLogprobs(int(prompt_ids[0]), math.nan, (), ())] if prompt_ids else []
    return head + [r for r in records[1:] if r is not None]


def _finite(x: float) -> float:
    """JSON has no -inf: a masked token's log-probability (processed mode) is sent as -9999.0, as vLLM does."""
    return x if math.isnan(x) or x > -9999.0 else -9999.0


def error_chunk(message: str, type_: str = "server_error", status: int = 500) -> bytes:
    """An error inside an open stream (the status line is already sent), as vLLM sends it."""
    return sse({"error": {"message": message, "type": type_, "param": None, "code": status}})


__all__ = ["Choice", "DONE", "ResponseBuilder", "error_chunk", "prompt_logprob_records", "sse"]
