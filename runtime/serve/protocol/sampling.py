"""The sampling fields of a request: OpenAI's ranges (temperature 0-2, top_p (0, 1], penalties
-2..2, logit_bias -100..100, n, logprobs) and vLLM's extensions (top_k, repetition_penalty,
min_tokens, stop_token_ids), each checked once with a 400 naming the field, the value, what is
expected and the fix."""

from __future__ import annotations

from typing import Any

from trtpipe.runtime.sample.params import MAX_N, MAX_TOP_LOGPROBS
from trtpipe.runtime.serve.errors import bad_field
from trtpipe.runtime.serve.protocol.fields import get, is_int, is_num


def parse_sampling(doc: dict) -> dict[str, Any]:
    """``temperature`` (default 1), ``top_p``, ``top_k`` (0 or -1 = off, stored as 0), ``seed``,
    the penalties, ``logit_bias``, ``min_tokens``, ``stop_token_ids`` and ``n``."""
    top_k = get(doc, "top_k", 0, lambda v: is_int(v) and v >= -1, "an int >= 0 (0 or -1 = off)", "send e.g. 50")
    out: dict[str, Any] = dict(
        temperature=float(
            get(
                doc,
                "temperature",
                1.0,
                lambda v: is_num(v) and 0 <= v <= 2,
                "a number in [0, 2] (0 = greedy; OpenAI's range)",
                "send e.g. 0 (greedy), 0.7 or at most 2",
            )
        ),
        top_p=float(
            get(
                doc, "top_p", 1.0, lambda v: is_num(v) and 0 < v <= 1, "a number in (0, 1]", "send e.g. 0.9, or 1 (off)"
            )
        ),
        top_k=max(0, int(top_k)),
        seed=get(
            doc, "seed", None, lambda v: is_int(v) and 0 <= v < 2**63, "null or an int in [0, 2^63)", "send e.g. 0"
        ),
        repetition_penalty=float(
            get(
                doc,
                "repetition_penalty",
                1.0,
                lambda v: is_num(v) and 0 < v <= 2,
                "a number in (0, 2] (1 = off; vLLM's repetition_penalty)",
                "send e.g. 1.1, or 1 (off)",
            )
        ),
        min_tokens=get(doc, "min_tokens", 0, lambda v: is_int(v) and v >= 0, "an int >= 0", "send e.g. 4, or 0 (off)"),
        n=get(
            doc,
            "n",
            1,
            lambda v: is_int(v) and 1 <= v <= MAX_N,
            f"an int in [1, {MAX_N}]",
            f"send n <= {MAX_N}, or several requests",
        ),
    )
    for name in ("presence_penalty", "frequency_penalty"):
        out[name] = float(
            get(
                doc,
                name,
                0.0,
                lambda v: is_num(v) and -2 <= v <= 2,
                "a number in [-2, 2] (0 = off; OpenAI's range)",
                "send e.g. 0.5, or 0 (off)",
            )
        )
    out["logit_bias"] = _parse_logit_bias(doc.get("logit_bias"))
    ids = doc.get("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(is_int(t) and t >= 0 for t in ids)):
        raise bad_field("stop_token_ids", ids, "a list of token ids (ints >= 0)", "send e.g. [2], or drop it")
    out["stop_token_ids"] = tuple(ids or ())
    return out


def _parse_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: ``{"<token id>": bias}``, bias in [-100, 100]."""
    if bias is None:
        return ()
    fix = 'send e.g. {"7042": 5} (token ids from POST /tokenize, bias in [-100, 100])'
    if not isinstance(bias, dict):
        raise bad_field("logit_bias", bias, "an object mapping token ids to numbers", fix)
    out = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise bad_field(f"logit_bias[{key!r}]", key, "a token id written as a decimal string", fix)
        if not (is_num(value) and -100 <= value <= 100):
            raise bad_field(f"logit_bias[{key!r}]", value, "a number in [-100, 100]", fix)
        out.append((int(key), float(value)))
    return tuple(out)


def parse_logprobs(doc: dict, kind: str) -> int | None:
    """The number of top alternatives per token, or None (off).

    Chat: ``logprobs`` true/false and ``top_logprobs`` 0-20 (only with logprobs true).
    Completions: ``logprobs`` an int 0-20 (OpenAI's limit is 5; vLLM's default limit, 20, is kept).
    """
    value = doc.get("logprobs")
    top = doc.get("top_logprobs")
    limit = f"[0, {MAX_TOP_LOGPROBS}]"
    if kind == "completion":
        if value is None or value is False:
            return None
        if not (is_int(value) and 0 <= value <= MAX_TOP_LOGPROBS):
            raise bad_field("logprobs", value, f"null or an int in {limit} (alternatives per token)", "send e.g. 5")
        return int(value)
    if value is not None and not isinstance(value, bool):
        raise bad_field("logprobs", value, "true or false", "send logprobs: true and top_logprobs: N")
    if top is not None:
        if not (is_int(top) and 0 <= top <= MAX_TOP_LOGPROBS):
            raise bad_field("top_logprobs", top, f"an int in {limit}", "send e.g. top_logprobs: 5")
        if not value:
            raise bad_field("top_logprobs", top, "null unless logprobs is true (OpenAI's rule)", "send logprobs: true")
    return (int(top or 0)) if value else None


__all__ = ["parse_logprobs", "parse_sampling"]
