"""``SamplingParams``: how a request picks its next token and when it stops, checked once.

Follows vLLM's ``SamplingParams`` (reduced). temperature 0 means greedy (argmax); top_k 0 and
top_p 1.0 are off; ``seed`` seeds the request's own generator.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from trtpipe.runtime.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token and when to stop. Validated by :meth:`validate`.

    temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 are off. ``seed`` seeds the
    request's own generator (reproducible sampling). ``stop`` strings are matched on the text by
    the layer that owns the detokenizer; ``stop_token_ids`` and EOS are checked by the scheduler.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Accept lists for convenience but store tuples, so the record stays immutable/hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Raise :class:`RequestError` naming the field, the value, the expectation and a fix.

        Returns ``self`` so it can be chained.
        """

        def bad(name: str, expected: str, fix: str) -> RequestError:
            value = getattr(self, name)
            return RequestError(f"SamplingParams.{name} = {value!r}: expected {expected}; fix: {fix}")

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
        return self


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


__all__ = ["SamplingParams", "require_bools"]
