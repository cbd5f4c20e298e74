"""The request body: UTF-8 JSON, one object (every other shape is a 400 naming ``body``)."""

from __future__ import annotations

import json

from trtpipe.runtime.serve.errors import ServeError, bad_field


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object; 400 for non-UTF-8 bytes, invalid JSON or a non-object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServeError(
            400,
            f"body: byte {e.start} ({raw[e.start : e.start + 1]!r}) is not valid UTF-8; "
            "expected a UTF-8 JSON object. Fix: encode the request body as UTF-8.",
            param="body",
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ServeError(
            400,
            f"body: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); expected "
            "a JSON object. Fix: send valid JSON with Content-Type: application/json.",
            param="body",
        ) from None
    except RecursionError:  # json's C scanner recurses once per level: "[[[[..." exhausts the stack
        raise ServeError(
            400,
            "body: JSON nested too deeply to parse; expected a JSON object of OpenAI "
            "request fields. Fix: send the request body, not a deeply nested value.",
            param="body",
        ) from None
    if not isinstance(doc, dict):
        fix = 'send an object, e.g. {"model": ..., "messages": [...]} (chat) or {"model": ..., "prompt": ...}'
        raise bad_field("body", doc, "a JSON object", fix)
    return doc


__all__ = ["parse_json_body"]
