"""``POST /v1/completions`` and ``POST /v1/chat/completions`` bodies -> one
:class:`GenerationRequest`: the fields both share (model, sampling, stream, structured output,
refusals), then the prompt or the messages.

Defaults are OpenAI's, written down rather than hidden: ``temperature`` 1.0, ``top_p`` 1.0,
``max_tokens`` 16 for completions and "up to max_seq_len" for chat, ``n`` 1, ``stream`` false.
"""

from __future__ import annotations

from trtpipe.runtime.serve.errors import ServeError, bad_field
from trtpipe.runtime.serve.protocol.fields import (
    CHAT_SUPPORTED,
    COMPLETION_SUPPORTED,
    get,
    get_bool,
    is_int,
    refuse_unimplemented,
)
from trtpipe.runtime.serve.protocol.messages import parse_messages
from trtpipe.runtime.serve.protocol.request import GenerationRequest
from trtpipe.runtime.serve.protocol.sampling import parse_logprobs, parse_sampling
from trtpipe.runtime.serve.protocol.structured import parse_structured


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
    stream = get(doc, "stream", False, lambda v: isinstance(v, bool), "true or false", "send a JSON boolean")
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
            value = get(doc, alias, None, lambda v: is_int(v) and v > 0, "an int > 0", f"send e.g. {alias}: 64")
            return value, alias
    return None, None


def parse_add_special_tokens(doc: dict) -> bool:
    """``add_special_tokens`` of ``POST /tokenize`` (vLLM's field): a JSON boolean, default true.
    Strict: the string "false" is a 400, not a truthy value."""
    return get(
        doc,
        "add_special_tokens",
        True,
        lambda v: isinstance(v, bool),
        "true or false",
        'send a JSON boolean (false, not "false")',
    )


def _common(doc: dict, served_models: tuple[str, ...], kind: str) -> dict:
    """Fields shared by completions and chat (model, sampling, stream, structure, refusals)."""
    model = _parse_model(doc, served_models)
    ignored = refuse_unimplemented(doc, COMPLETION_SUPPORTED if kind == "completion" else CHAT_SUPPORTED)
    stop = _parse_stop(doc)
    stream, opts = _parse_stream(doc)
    sampling = parse_sampling(doc)
    max_tokens, max_tokens_param = _parse_max_tokens(doc)
    if max_tokens is not None and sampling["min_tokens"] > max_tokens:
        raise bad_field(
            "min_tokens", sampling["min_tokens"], f"at most {max_tokens_param} = {max_tokens}", "lower min_tokens"
        )
    return dict(
        model=model,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        **sampling,
        stop=stop,
        ignore_eos=get_bool(doc, "ignore_eos"),
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        return_token_ids=get_bool(doc, "return_token_ids"),
        speculative=get_bool(doc, "speculative", True),
        cache_salt=get(
            doc,
            "cache_salt",
            None,
            lambda v: isinstance(v, str) and v != "",
            "null or a non-empty string (vLLM's cache_salt)",
            'send e.g. "cache_salt": "tenant-42", or drop it (the shared prefix cache)',
        ),
        logprobs=parse_logprobs(doc, kind),
        structured=parse_structured(doc),
        ignored_fields=ignored,
    )


def parse_completion(doc: dict, served_models: tuple[str, ...]) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` is a non-empty string, a list of one string, or a
    non-empty list of token ids. ``echo`` puts the prompt text before the completion, and with
    ``logprobs`` the prompt tokens' logprobs before the completion's (the first is null); the
    prompt is then prefilled one token per step (its TTFT grows with its length)."""
    common = _common(doc, served_models, "completion")
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt.strip():
            raise bad_field("prompt", prompt, "non-empty text", "send the text to complete")
    elif isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        prompt = tuple(int(t) for t in prompt)
    else:
        raise bad_field(
            "prompt",
            prompt,
            "a non-empty string or a non-empty list of token ids (one prompt)",
            'send e.g. "prompt": "Once upon a time" or "prompt": [1, 2, 3], one prompt per request',
        )
    echo = get_bool(doc, "echo")
    if common["max_tokens"] is None:
        common["max_tokens"] = 16  # OpenAI's documented default for completions
    return GenerationRequest(kind="completion", prompt=prompt, messages=None, echo=echo, **common)


def parse_chat(doc: dict, served_models: tuple[str, ...]) -> GenerationRequest:
    """``POST /v1/chat/completions``: ``messages`` (:func:`parse_messages`: roles and text parts)."""
    common = _common(doc, served_models, "chat")
    messages = parse_messages(doc.get("messages"))
    return GenerationRequest(kind="chat", prompt="", messages=messages, **common)


__all__ = ["ServeError", "parse_add_special_tokens", "parse_chat", "parse_completion"]
