"""``SamplingParams``: how a request picks its next token and when it stops, checked once.

Follows vLLM's ``SamplingParams`` (reduced) and OpenAI's ranges: temperature 0 means greedy
(argmax); top_k 0 and top_p 1.0 are off; ``seed`` seeds the request's own generator;
``presence_penalty`` / ``frequency_penalty`` in [-2, 2] (OpenAI), ``repetition_penalty`` > 0
(vLLM's, 1.0 = off), ``logit_bias`` token id -> bias in [-100, 100], ``min_tokens`` (EOS and stop
tokens masked until reached), ``logprobs`` (None = off, N = the sampled token's log-probability
plus the N most likely, 0-20), ``prompt_logprobs`` (the same for every prompt token after the
first; the prompt is then prefilled one token per step, without the prefix cache), ``n`` (1-8 choices of one prompt), ``structured`` (a JSON schema
or "any JSON object" the output must follow, see :mod:`trtpipe.runtime.sample.structured`), ``speculative``
(False: this request opts out of speculative decoding where the runtime has it on).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.structured import StructuredOutput

MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_N = 8  # choices per request (the decode batch is 8 rows)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: [-100, 100]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token and when to stop. Validated by :meth:`validate`.

    temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 are off. ``seed`` seeds the
    request's own generator (reproducible sampling). ``stop`` strings are matched on the text by
    the layer that owns the detokenizer; ``stop_token_ids`` and EOS are checked by the scheduler.
    ``logit_bias`` may be given as a mapping; it is stored as sorted ``(token_id, bias)`` pairs.
    Token ids in ``logit_bias`` / ``stop_token_ids`` are checked against the vocabulary by
    :func:`~trtpipe.runtime.sched.request.new_request` (it knows the vocabulary size).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    structured: StructuredOutput | None = None
    speculative: bool = True  # False: never verify proposed tokens for this request (plain decode)

    def __post_init__(self) -> None:
        # Accept lists/dicts for convenience but store tuples, so the record stays immutable/hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((k, v) for k, v in bias)))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """True when presence, frequency or repetition penalties change the logits."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> SamplingParams:
        """Raise :class:`RequestError` (``field`` = the parameter) naming the field, the value,
        the expectation and a fix. Returns ``self`` so it can be chained."""

        def bad(name: str, expected: str, fix: str) -> RequestError:
            value = getattr(self, name)
            return RequestError(f"SamplingParams.{name} = {value!r}: expected {expected}; fix: {fix}", field=name)

        if not _is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise bad("max_new_tokens", "an int > 0", "pass e.g. max_new_tokens=128")
        if not _is_real(self.temperature) or not (0 <= self.temperature < math.inf):
            raise bad("temperature", "a finite float >= 0 (0 = greedy)", "pass 0.0 (greedy) or e.g. 0.7")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "an int >= 0 (0 = off)", "pass top_k=0 (off) or e.g. top_k=50")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", "a float in (0, 1] (1.0 = off)", "pass top_p=1.0 (off) or e.g. 0.9")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise bad("seed", "None or an int >= 0", "pass seed=None (random) or e.g. seed=0")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "a tuple of non-empty strings", 'pass e.g. stop=("\\n\\n",) or ()')
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a tuple of token ids (ints >= 0)", "pass e.g. (2,) or ()")
        self._validate_extensions(bad)
        return self

    def _validate_extensions(self, bad: Callable[[str, str, str], RequestError]) -> None:
        """Penalties, bias, min_tokens, logprobs, n (OpenAI's and vLLM's ranges)."""
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2.0 <= v <= 2.0:
                raise bad(name, "a number in [-2, 2] (0 = off; OpenAI's range)", f"pass e.g. {name}=0.5")
        r = self.repetition_penalty
        if not _is_real(r) or not (0.0 < r < math.inf):
            raise bad("repetition_penalty", "a finite number > 0 (1.0 = off)", "pass e.g. 1.1")
        if not all(_is_int(k) and k >= 0 and _is_real(v) and abs(v) <= MAX_LOGIT_BIAS for k, v in self.logit_bias):
            raise bad("logit_bias", "token id (int >= 0) -> bias in [-100, 100]", 'pass e.g. {"42": 5}')
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise bad("min_tokens", f"an int in [0, max_new_tokens = {self.max_new_tokens}]", "pass e.g. 4")
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_TOP_LOGPROBS):
                raise bad(name, f"None or an int in [0, {MAX_TOP_LOGPROBS}]", f"pass e.g. {name}=5")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"an int in [1, {MAX_N}]", "pass e.g. n=2, or send more requests")
        if not isinstance(self.speculative, bool):
            raise bad("speculative", "True or False", "pass speculative=False to opt out of speculative decoding")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise bad("structured", "None or a StructuredOutput", "pass StructuredOutput.json_schema(schema)")


def require_bools(**flags: object) -> None:
    """Raise :class:`RequestError` naming the first flag that is not a bool ("no", "false", 0 and
    None are refused, never read as truthy or falsy)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(f"{name} = {value!r}: expected True or False. Fix: pass {name}=True or False.")


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


__all__ = ["MAX_N", "MAX_TOP_LOGPROBS", "SamplingParams", "require_bools"]
