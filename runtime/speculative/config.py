"""``SpeculativeConfig``: the speculative-decoding settings (recipe ``runtime.speculative``, ``serve
--speculative``, ``LLM(speculative=...)``), checked once here.

``method``: ``ngram`` (prompt lookup: :mod:`trtpipe.runtime.speculative.ngram`), the only method: no
second model. ``max_k``: most proposed tokens verified per request and step (the sizing picks
0..max_k from the measured verify cost, :mod:`trtpipe.runtime.speculative.sizing`). ``min_n`` /
``max_n``: the n-gram lengths matched against the request's context, longest first (vLLM's
``prompt_lookup_min`` / ``prompt_lookup_max``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.errors import RequestError

METHODS = ("ngram",)
MAX_K_LIMIT = 16  # a verify chunk of k + 1 tokens; beyond ~8 it costs more than it can return here


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding without a draft model. Raises :class:`RequestError` (``field`` =
    ``speculative.<name>``) for a bad value, naming what was expected and the fix."""

    method: str = "ngram"
    max_k: int = 4
    min_n: int = 2
    max_n: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise _bad("method", self.method, f"one of {list(METHODS)}", "use method: ngram (prompt lookup)")
        for name, lo, hi in (("max_k", 1, MAX_K_LIMIT), ("min_n", 1, 16), ("max_n", 1, 16)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise _bad(name, v, f"an int in [{lo}, {hi}]", f"pass e.g. {name}: {getattr(SpeculativeConfig, name)}")
        if self.min_n > self.max_n:
            raise _bad("min_n", self.min_n, f"<= max_n = {self.max_n}", "lower min_n or raise max_n")

    def describe(self) -> str:
        return f"speculative: {self.method}, up to {self.max_k} tokens per step, n-grams {self.min_n}..{self.max_n}"


def _bad(name: str, value: object, expected: str, fix: str) -> RequestError:
    return RequestError(
        f"speculative.{name} = {value!r}: expected {expected}. Fix: {fix}.", field=f"speculative.{name}"
    )


__all__ = ["METHODS", "SpeculativeConfig"]
