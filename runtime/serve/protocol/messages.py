"""Chat ``messages``, OpenAI's way: roles system, developer, user, assistant, tool; content a
string or a list of text parts; every refusal names ``messages[i]...``, the value and the fix.

``developer`` is OpenAI's newer name for ``system`` and is rendered as ``system`` (the chat
template of this model knows system, user and assistant). Image, audio and file parts are
refused (this model reads text only); an assistant's ``tool_calls`` too (no tool calling).
"""

from __future__ import annotations

from typing import Any

from trtpipe.runtime.serve.errors import bad_field

ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_KEYS = {"role", "content", "name", "tool_call_id", "tool_calls", "refusal", "function_call", "audio"}


def parse_messages(messages: Any) -> tuple[dict[str, str], ...]:
    """``[{"role", "content"}]`` with text content, roles checked; 400 naming the message."""
    if not isinstance(messages, list) or not messages:
        raise bad_field(
            "messages",
            messages,
            'a non-empty list of {"role": ..., "content": ...}',
            'send e.g. [{"role": "user", "content": "Hi"}]',
        )
    out = [_message(i, m) for i, m in enumerate(messages)]
    if not any(m["content"].strip() for m in out):
        raise bad_field("messages", messages, "at least one message with non-empty content", "send the user's question")
    return tuple(out)


def _message(i: int, m: Any) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_field(where, m, 'an object {"role": ..., "content": ...}', 'send {"role": "user", "content": "..."}')
    role = m.get("role")
    if role not in ROLES:
        raise bad_field(f"{where}.role", role, f"one of {', '.join(ROLES)}", 'send "user" (or "system"/"assistant")')
    unknown = sorted(set(m) - _MESSAGE_KEYS)
    if unknown:
        raise bad_field(f"{where}.{unknown[0]}", m[unknown[0]], "no such message field", f"drop {unknown[0]}")
    for name in ("tool_calls", "function_call", "audio"):
        if m.get(name):
            raise bad_field(
                f"{where}.{name}", m[name], "null (tool calling and audio are not supported)", f"drop {name}"
            )
    if m.get("name") is not None and not isinstance(m["name"], str):
        raise bad_field(f"{where}.name", m["name"], "a string", "send the participant's name as a string")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise bad_field(
            f"{where}.tool_call_id", m.get("tool_call_id"), "a string (tool messages answer a call)", "send it"
        )
    return {"role": "system" if role == "developer" else role, "content": _content(where, m.get("content"))}


def _content(where: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_field(f"{where}.content", None, "a string or a list of text parts", "send the message text")
    if not isinstance(content, list):
        raise bad_field(f"{where}.content", content, "a string or a list of text parts", "send the message text")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise bad_field(at, part, '{"type": "text", "text": ...}', "send text parts")
        if part.get("type") != "text":
            raise bad_field(
                f"{at}.type", part.get("type"), '"text" (this model reads text only)', "send the content as text"
            )
        if not isinstance(part.get("text"), str):
            raise bad_field(f"{at}.text", part.get("text"), "a string", "send the part's text as a string")
        texts.append(part["text"])
    return "".join(texts)


__all__ = ["ROLES", "parse_messages"]
