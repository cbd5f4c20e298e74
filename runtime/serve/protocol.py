"""OpenAI request bodies -> one validated :class:`GenerationRequest`; errors as OpenAI error JSON.

Follows the OpenAI API reference (``/v1/completions``, ``/v1/chat/completions``) and vLLM's
extensions (``top_k``, ``ignore_eos``, ``return_token_ids``). Every field is checked here, once,
at the edge; a bad one raises :class:`ServeError` whose message names the field, the value, what
was expected and the fix, and whose body is OpenAI's error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

``cache_salt`` (vLLM's extension): requests share prefix-cache blocks only with requests of the
same salt (null: the common cache), so one tenant cannot time another's prompts.

Defaults are OpenAI's, written down rather than hidden: ``temperature`` 1.0, ``top_p`` 1.0,
``max_tokens`` 16 for completions and "up to max_seq_len" for chat, ``n`` 1, ``stream`` false.
Unknown fields are ignored (clients send many); fields we cannot honour (``n`` > 1, ``logprobs``,
``echo``, ``best_of`` > 1, ``tools``) are refused with a 400 that says so, never silently dropped.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.serve.errors import ServeError, bad_field


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation request (completions or chat), in runtime terms.

    ``prompt`` is text (already chat-templated for chat) or token ids; ``max_tokens`` None means
    "up to max_seq_len" (resolved once the prompt is tokenized).
    """

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | tuple[int, ...]
    messages: tuple[dict, ...] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    cache_salt: str | None = None  # vLLM's field: only requests with the same salt share prefix-cache blocks
    max_tokens_param: str | None = None  # the field the client set max_tokens with; None: OpenAI's default

    def sampling_params(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
        )  # checked with the prompt by new_request, the one place requests are checked


def max_new_tokens(req: GenerationRequest, num_prompt_tokens: int, max_seq_len: int, prompt_field: str) -> int:
    """``max_tokens``, or when unset everything up to max_seq_len (chat) or OpenAI's default 16
    capped to what fits (completions, as vLLM does). A client's max_tokens that does not fit
    beside the prompt is a 400 ``context_length_exceeded`` naming the field, the value and the
    most that fits (vLLM's and OpenAI's refusal). A prompt that leaves no room at all gets 1 here:
    ``new_request`` then refuses it with the runtime's one prompt-length rule."""
    room = max_seq_len - num_prompt_tokens
    if room < 1:
        return 1
    if req.max_tokens is None:
        return room
    if req.max_tokens <= room or req.max_tokens_param is None:
        return min(req.max_tokens, room)
    param = req.max_tokens_param
    drop = f", or drop {param} (chat then generates up to the context length)" if req.kind == "chat" else ""
    shorter = "shorter messages" if req.kind == "chat" else "a shorter prompt"
    raise ServeError(
        400,
        f"{param} = {req.max_tokens}: this model's maximum context length is {max_seq_len} tokens. However, "
        f"you requested {num_prompt_tokens + req.max_tokens} tokens ({num_prompt_tokens} in the {prompt_field}, "
        f"{req.max_tokens} in the completion); expected {param} <= {room}. Fix: send {param} <= {room}, "
        f"or {shorter}{drop}.",
        param=param,
        code="context_length_exceeded",
    )


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
        raise bad_field("body", doc, "a JSON object", 'send e.g. {"model": ..., "prompt": ...}')
    return doc


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _get(doc: dict, name: str, default: Any, ok: Callable[[Any], bool], expected: str, fix: str) -> Any:
    value = doc.get(name)
    if value is None:
        return default
    if not ok(value):
        raise bad_field(name, value, expected, fix)
    return value


def _refuse_unsupported(doc: dict) -> None:
    """400 for OpenAI fields this server does not implement (n > 1, best_of, logprobs, tools...)."""
    n = doc.get("n")
    if n is not None and n != 1:
        raise bad_field(
            "n",
            n,
            "1 (one choice per request; this server does not sample n > 1)",
            "drop n, or send n separate requests",
        )
    best_of = doc.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_field("best_of", best_of, "1 (not supported)", "drop best_of")
    for name in ("logprobs", "top_logprobs", "tools", "functions", "logit_bias", "suffix"):
        value = doc.get(name)
        if value is not None and value is not False and value != [] and value != {}:
            raise bad_field(name, doc[name], "null (not supported by this server)", f"drop {name}")
    if doc.get("echo") not in (None, False):
        raise bad_field("echo", doc["echo"], "false (not supported)", "drop echo")


def _parse_stop(doc: dict) -> tuple[str, ...]:
    """``stop``: null, a non-empty string or a list of non-empty strings -> a tuple."""
    stop = doc.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str) and stop:
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        return tuple(stop)
    raise bad_field(
        "stop", stop, "a non-empty string or a list of non-empty strings", 'send e.g. "stop": ["\\n\\n"] or drop it'
    )


def _parse_stream(doc: dict) -> tuple[bool, dict | None]:
    """``stream`` and ``stream_options`` (only with stream: true)."""
    stream = _get(doc, "stream", False, lambda v: isinstance(v, bool), "true or false", "send a JSON boolean")
    opts = doc.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool)):
        raise bad_field("stream_options", opts, '{"include_usage": true|false}', "send that object or drop it")
    if opts and not stream:
        raise bad_field(
            "stream_options",
            opts,
            "null when stream is false (OpenAI's rule)",
            "set stream: true or drop stream_options",
        )
    return stream, opts


def _parse_model(doc: dict, served_models: tuple[str, ...]) -> str:
    """``model``: one of ``served_models``, else :class:`ServeError` (HTTP 400, code ``model_not_found``)."""
    model = doc.get("model")
    if not isinstance(model, str) or model not in served_models:
        raise ServeError(
            400,
            f"model = {model!r}: expected one of the served models "
            f"{list(served_models)}. Fix: pass model={served_models[0]!r} "
            "(GET /v1/models lists them).",
            param="model",
            code="model_not_found",
        )
    return model


def _parse_max_tokens(doc: dict) -> tuple[int | None, str | None]:
    """``max_completion_tokens`` (preferred) or its alias ``max_tokens``, and which one was sent;
    (None, None) = not sent. Whether it fits the context is checked once the prompt is tokenized."""
    for alias in ("max_completion_tokens", "max_tokens"):
        if doc.get(alias) is not None:
            value = _get(doc, alias, None, lambda v: _is_int(v) and v > 0, "an int > 0", f"send e.g. {alias}: 64")
            return value, alias
    return None, None


def _parse_sampling(doc: dict) -> dict:
    """``temperature``, ``top_p``, ``top_k`` (0 or -1 = off, stored as 0) and ``seed``."""
    top_k = _get(
        doc, "top_k", 0, lambda v: _is_int(v) and v >= -1, "an int >= 0 (0 or -1 = off)", "send e.g. 50, or drop it"
    )
    return dict(
        temperature=float(
            _get(
                doc,
                "temperature",
                1.0,
                lambda v: _is_num(v) and v >= 0,
                "a finite number >= 0 (0 = greedy)",
                "send e.g. 0 (greedy) or 0.7",
            )
        ),
        top_p=float(
            _get(
                doc,
                "top_p",
                1.0,
                lambda v: _is_num(v) and 0 < v <= 1,
                "a number in (0, 1]",
                "send e.g. 0.9, or 1 (off)",
            )
        ),
        top_k=max(0, int(top_k)),
        seed=_get(doc, "seed", None, lambda v: _is_int(v) and v >= 0, "null or an int >= 0", "send e.g. 0"),
    )


def parse_add_special_tokens(doc: dict) -> bool:
    """``add_special_tokens`` of ``POST /tokenize`` (vLLM's field): a JSON boolean, default true.
    Strict: the string "false" is a 400, not a truthy value."""
    return _get(
        doc,
        "add_special_tokens",
        True,
        lambda v: isinstance(v, bool),
        "true or false",
        'send a JSON boolean (false, not "false")',
    )


def _common(doc: dict, served_models: tuple[str, ...]) -> dict:
    """Fields shared by completions and chat (model, sampling, stream, refusals)."""
    model = _parse_model(doc, served_models)
    _refuse_unsupported(doc)
    stop = _parse_stop(doc)
    stream, opts = _parse_stream(doc)
    sampling = _parse_sampling(doc)
    max_tokens, max_tokens_param = _parse_max_tokens(doc)
    return dict(
        model=model,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        **sampling,
        stop=stop,
        ignore_eos=_get(
            doc, "ignore_eos", False, lambda v: isinstance(v, bool), "true or false", "send a JSON boolean"
        ),
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        return_token_ids=_get(
            doc, "return_token_ids", False, lambda v: isinstance(v, bool), "true or false", "send a JSON boolean"
        ),
        cache_salt=_get(
            doc,
            "cache_salt",
            None,
            lambda v: isinstance(v, str) and v != "",
            "null or a non-empty string (vLLM's cache_salt)",
            'send e.g. "cache_salt": "tenant-42", or drop it (the shared prefix cache)',
        ),
    )


def parse_completion(doc: dict, served_models: tuple[str, ...]) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` is a non-empty string, a list of one string, or a
    non-empty list of token ids."""
    common = _common(doc, served_models)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt.strip():
            raise bad_field("prompt", prompt, "non-empty text", "send the text to complete")
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        prompt = tuple(int(t) for t in prompt)
    else:
        raise bad_field(
            "prompt",
            prompt,
            "a non-empty string or a non-empty list of token ids (one prompt)",
            "send one prompt per request",
        )
    if common["max_tokens"] is None:
        common["max_tokens"] = 16  # OpenAI's documented default for completions
    return GenerationRequest(kind="completion", prompt=prompt, messages=None, **common)


def parse_chat(doc: dict, served_models: tuple[str, ...]) -> GenerationRequest:
    """``POST /v1/chat/completions``: ``messages`` is a non-empty list of {role, content}; content
    is a string or a list of ``{"type": "text", "text": ...}`` parts (joined)."""
    common = _common(doc, served_models)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field(
            "messages",
            messages,
            'a non-empty list of {"role": ..., "content": ...}',
            'send e.g. [{"role": "user", "content": "Hi"}]',
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_field(
                f"messages[{i}]", m, 'an object with a string "role"', 'send {"role": "user", "content": "..."}'
            )
        content = m.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise bad_field(
                    f"messages[{i}].content",
                    content,
                    'text parts {"type": "text", "text": ...} (this model reads text only)',
                    "send the content as a string",
                )
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_field(f"messages[{i}].content", content, "a string", "send the message text as a string")
        out.append({"role": m["role"], "content": content})
    if not any(m["content"].strip() for m in out):
        raise bad_field("messages", messages, "at least one message with non-empty content", "send the user's question")
    return GenerationRequest(kind="chat", prompt="", messages=tuple(out), **common)


__all__ = [
    "ServeError",
    "GenerationRequest",
    "bad_field",
    "parse_add_special_tokens",
    "parse_json_body",
    "parse_completion",
    "parse_chat",
]
