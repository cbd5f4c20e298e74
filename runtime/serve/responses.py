"""OpenAI response bodies and Server-Sent Events chunks, built from engine events.

Shapes follow the OpenAI API reference (``text_completion``, ``chat.completion``,
``chat.completion.chunk``) and vLLM's id fields: ``prompt_token_ids`` (top level) and
``token_ids`` (per choice, per stream delta) when the request asked ``return_token_ids``. Text
fields only ever hold detokenizer text; ids only ever sit in the id fields.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from trtpipe.runtime.serve.protocol import GenerationRequest


def sse(doc: dict | str) -> bytes:
    """One SSE event: ``data: <json>\\n\\n`` (UTF-8, non-ASCII kept as is)."""
    data = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


@dataclass
class ResponseBuilder:
    """Builds the bodies of one request (its id and creation time are fixed at construction)."""

    req: GenerationRequest
    prompt_token_ids: tuple[int, ...]
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def _chat(self) -> bool:
        return self.req.kind == "chat"

    def _head(self, chunk: bool) -> dict:
        if self._chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
            return {"id": f"chatcmpl-{self.id}", "object": obj, "created": self.created, "model": self.req.model}
        return {"id": f"cmpl-{self.id}", "object": "text_completion", "created": self.created, "model": self.req.model}

    def usage(self, num_output_tokens: int, cached_tokens: int = 0) -> dict:
        """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens whose KV
        came from the prefix cache (a multiple of the KV block size; 0 on a miss)."""
        n = len(self.prompt_token_ids)
        return {
            "prompt_tokens": n,
            "completion_tokens": num_output_tokens,
            "total_tokens": n + num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }

    def full(self, text: str, token_ids: list[int], finish_reason: str | None, cached_tokens: int = 0) -> dict:
        """The non-streaming response."""
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self._chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.req.return_token_ids:
            choice["token_ids"] = list(token_ids)
        doc = {**self._head(False), "choices": [choice], "usage": self.usage(len(token_ids), cached_tokens)}
        if self.req.return_token_ids:
            doc["prompt_token_ids"] = list(self.prompt_token_ids)
        return doc

    def chunk(
        self, text: str, token_ids: tuple[int, ...] = (), finish_reason: str | None = None, first: bool = False
    ) -> bytes:
        """One streamed chunk: a text delta (chat: ``delta.content``; the first chat chunk also
        carries ``role``), its token ids when asked, and the finish reason on the last one."""
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
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


def error_chunk(message: str, type_: str = "server_error", status: int = 500) -> bytes:
    """An error inside an open stream (the status line is already sent), as vLLM sends it."""
    return sse({"error": {"message": message, "type": type_, "param": None, "code": status}})


__all__ = ["ResponseBuilder", "sse", "DONE", "error_chunk"]
