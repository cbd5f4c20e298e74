"""The server's errors, in the project's error family: an HTTP error with an OpenAI-style body,
and the engine loop's refusal to admit.

    RequestError (runtime, field named) ──from_request_error──► ServeError 400 {error: {message,
    EngineBusy (queue full, draining)   ──busy_error──────────► ServeError 503    type, param, code}}
"""

from __future__ import annotations

from typing import Any

from trtpipe.runtime.errors import RequestError, TrtpipeError

RETRY_AFTER_S = 1  # what a 503 tells the client to wait before retrying


class ServeError(TrtpipeError):
    """An HTTP error with an OpenAI-style body (``status`` 400, 401, 404, 503, 500...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class EngineBusy(TrtpipeError):
    """The engine loop admits no more: too many requests waiting (``max_queued_requests``), a
    predicted queue wait over ``--max-queue-wait-ms`` ("overloaded"), the server is shutting down,
    or the loop died. ``reason`` is the metrics label; ``retry_after_s`` the 503's ``Retry-After``."""

    def __init__(self, reason: str, message: str, retry_after_s: int = RETRY_AFTER_S):
        super().__init__(message)
        self.reason = reason  # "queue_full" | "overloaded" | "shutting_down" | "engine_dead"
        self.retry_after_s = max(1, int(retry_after_s))  # whole seconds (the header's unit)


def bad_field(param: str, value: Any, expected: str, fix: str) -> ServeError:
    """400 naming the field, the value it had, what was expected and how to fix it."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ServeError(400, f"{param} = {shown}: expected {expected}. Fix: {fix}.", param=param)


def from_request_error(e: RequestError, prompt_field: str) -> ServeError:
    """The 400 of a request the runtime refused; a fault of the prompt is named ``prompt_field``
    (``prompt`` for completions, ``messages`` for chat)."""
    param = prompt_field if e.field in (None, "prompt") else e.field
    message = str(e)
    if e.field == "prompt" and not message.startswith(f"{param}:"):
        message = f"{param}: the {message}" if e.code == "context_length_exceeded" else f"{param}: {message}"
    return ServeError(400, message, param=param, code=e.code)


def busy_error(e: EngineBusy) -> ServeError:
    """The 503 of a refused admission, with ``Retry-After`` (seconds)."""
    return ServeError(
        503,
        f"overloaded: {e}; retry after {e.retry_after_s} s",
        type_="service_unavailable",
        code=e.reason,
        headers={"Retry-After": str(e.retry_after_s)},
    )


__all__ = ["RETRY_AFTER_S", "EngineBusy", "ServeError", "bad_field", "busy_error", "from_request_error"]
