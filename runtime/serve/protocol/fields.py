"""Which request fields the server knows, and the small checks every field parser shares.

Every field a client may send falls in one of four groups (docs/server.md has the same table):

- **supported**: parsed and honoured (:mod:`.sampling`, :mod:`.messages`, :mod:`.parse`);
- **accepted, no effect**: identifiers that change nothing about the output (``user``...);
- **refused**: OpenAI's (or vLLM's) fields trtpipe does not implement: a 400 naming the field,
  unless the value is the one that means "off" (``tools: []``, ``n: 1``...), never silently dropped;
- anything else is an **unknown extension**: ignored, as vLLM does, and counted on /metrics
  (``trtpipe:ignored_request_fields_total{field}``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from trtpipe.runtime.serve.errors import bad_field

COMMON_SUPPORTED = frozenset(
    {
        "model",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "max_tokens",
        "n",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        # vLLM's extensions
        "top_k",
        "ignore_eos",
        "return_token_ids",
        "cache_salt",
        "repetition_penalty",
        "min_tokens",
        "stop_token_ids",
        "guided_json",
        "structured_outputs",
        "response_format",
        # trtpipe's: false opts this request out of speculative decoding (serve --speculative)
        "speculative",
    }
)
COMPLETION_SUPPORTED = COMMON_SUPPORTED | {"prompt", "logprobs", "echo"}
CHAT_SUPPORTED = COMMON_SUPPORTED | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"}
NO_EFFECT = frozenset({"user", "safety_identifier", "metadata"})  # identifiers: nothing to honour

# field -> (the values that mean "off" and are accepted, what to do instead)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((1,), "drop best_of, or send n (n choices, each sampled once)"),
    "suffix": (("",), "drop suffix (insertion is not supported)"),
    "tools": (([],), "drop tools (tool calling is not supported); describe the call in a JSON schema response_format"),
    "tool_choice": (("none",), "drop tool_choice"),
    "parallel_tool_calls": ((), "drop parallel_tool_calls"),
    "functions": (([],), "drop functions (function calling is not supported); use response_format json_schema"),
    "function_call": (("none",), "drop function_call"),
    "audio": ((), "drop audio (this model reads and writes text only)"),
    "modalities": ((["text"],), 'drop modalities or send ["text"]'),
    "prediction": ((), "drop prediction (predicted outputs are not supported)"),
    "reasoning_effort": ((), "drop reasoning_effort (not a reasoning model)"),
    "verbosity": ((), "drop verbosity"),
    "web_search_options": ((), "drop web_search_options"),
    "service_tier": (("auto", "default"), 'drop service_tier or send "auto"'),
    "store": ((False,), "drop store (stored completions are not supported)"),
    "prompt_cache_key": ((), "drop prompt_cache_key; send cache_salt to separate prefix caches"),
    # vLLM's extensions that would change the output and are not implemented
    "min_p": ((0, 0.0), "drop min_p (use top_p or top_k)"),
    "prompt_logprobs": ((), "drop prompt_logprobs; send echo: true with logprobs to /v1/completions"),
    "allowed_token_ids": ((), "drop allowed_token_ids; use logit_bias or a response_format schema"),
    "bad_words": (([],), "drop bad_words; use logit_bias -100 on their tokens"),
    "guided_regex": ((), "drop guided_regex; use a json_schema string pattern"),
    "guided_choice": ((), 'drop guided_choice; use a json_schema {"enum": [...]}'),
    "guided_grammar": ((), "drop guided_grammar; use response_format json_schema"),
    "use_beam_search": ((False,), "drop use_beam_search"),
    "length_penalty": ((1, 1.0), "drop length_penalty (beam search only)"),
    "include_stop_str_in_output": ((False,), "drop include_stop_str_in_output"),
    "skip_special_tokens": ((True,), "drop skip_special_tokens"),
    "truncate_prompt_tokens": ((), "drop truncate_prompt_tokens; shorten the prompt"),
}


def refuse_unimplemented(doc: dict, supported: frozenset[str]) -> tuple[str, ...]:
    """400 for a refused field with a value other than "off"; returns the unknown fields
    (sorted, names cut to 64 characters), which the caller counts and ignores."""
    for name, (off, fix) in REFUSED.items():
        value = doc.get(name)
        if value is None or any(value == v and type(value) is type(v) for v in off):
            continue
        accepted = " or ".join(repr(v) for v in off)
        expected = f"null{' or ' + accepted if off else ''} (not supported by this server)"
        raise bad_field(name, value, expected, fix)
    known = supported | NO_EFFECT | REFUSED.keys()
    return tuple(sorted(str(k)[:64] for k in doc if k not in known))


def is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def get(doc: dict, name: str, default: Any, ok: Callable[[Any], bool], expected: str, fix: str) -> Any:
    """``doc[name]`` (``default`` when absent or null); 400 naming it when ``ok`` says no."""
    value = doc.get(name)
    if value is None:
        return default
    if not ok(value):
        raise bad_field(name, value, expected, fix)
    return value


def get_bool(doc: dict, name: str, default: bool = False) -> bool:
    """A JSON boolean (the string "false" is a 400, not a truthy value)."""
    return get(doc, name, default, lambda v: isinstance(v, bool), "true or false", "send a JSON boolean")


__all__ = [
    "CHAT_SUPPORTED",
    "COMPLETION_SUPPORTED",
    "NO_EFFECT",
    "REFUSED",
    "get",
    "get_bool",
    "is_int",
    "is_num",
    "refuse_unimplemented",
]
