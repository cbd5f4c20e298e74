"""Structured outputs with llguidance: JSON schemas compiled against the artifact's tokenizer,
cached by schema hash, and the per-step token masks of the constrained rows of a batch.

    StructuredOutput ──GrammarCompiler.compile (cached by sha256 of the schema; thread-safe,
                       called off the event loop)──► grammar ──matcher()──► LLMatcher per request
    each step: fill_bitmask (one llguidance call for all constrained rows, Rust threads)
               ──► bitmask [S, ceil(V/32)] int32 ──► processors.apply_bitmask ──► sample
               ──► LLMatcher.consume_token(sampled)

llguidance (Rust core, no torch) is imported lazily, only when a request asks for a schema; it is
in the ``serve`` extra. Its matchers never raise on a bad token: they enter an error state, which
:func:`consume` reports.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.structured import StructuredOutput

MAX_CACHED_GRAMMARS = 256
# JSON layout: json.dumps' separators and no other whitespace. llguidance's default (any run of
# whitespace between tokens) lets a small model loop on newlines until max_tokens (measured:
# 2 of 16 SmolLM2 outputs cut mid-document); a schema's "x-guidance" options still override this.
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompiler:
    """Compiles :class:`StructuredOutput` records to llguidance grammars for one tokenizer.

    Args:
        tokenizer_json: the artifact's ``tokenizer.json`` text.
        vocab_size: logits width ``V`` (masks are ``ceil(V / 32)`` int32 words per row).
        eos_token_id: the token that ends a finished JSON document.

    ``hits`` / ``misses`` count cache lookups (tests, metrics). Raises :class:`RequestError`
    (``field`` "response_format") from :meth:`compile` for a schema llguidance cannot compile.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_id: int | None) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lltok: Any = None
        self._executor: Any = None
        self.hits = 0
        self.misses = 0

    @property
    def lltokenizer(self) -> Any:
        """The ``llguidance.LLTokenizer`` (built once, ~0.3 s)."""
        with self._lock:
            if self._lltok is None:
                import llguidance

                self._lltok = llguidance.LLTokenizer(self._tokenizer_json, n_vocab=self.vocab_size, eos_token=self._eos)
            return self._lltok

    def compile(self, so: StructuredOutput) -> str:
        """The llguidance grammar of ``so`` (cached by ``so.key``); raises :class:`RequestError`
        naming the schema path at fault and llguidance's reason."""
        with self._lock:
            cached = self._cache.get(so.key)
            if cached is not None:
                self._cache.move_to_end(so.key)
                self.hits += 1
                return cached
        from llguidance import LLMatcher

        grammar = ""
        try:
            grammar = LLMatcher.grammar_from_json_schema(so.schema_json, defaults=JSON_OPTIONS)
            is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        except ValueError as e:
            is_error, messages = True, [str(e)]
        if is_error:
            raise _schema_error(so, messages[0] if messages else "unknown error")
        with self._lock:
            self.misses += 1
            self._cache[so.key] = grammar
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, so: StructuredOutput) -> Any:
        """A fresh ``llguidance.LLMatcher`` for one request (compiles or reuses the grammar)."""
        from llguidance import LLMatcher

        return LLMatcher(self.lltokenizer, self.compile(so), log_level=0)

    def fill_bitmask(self, matchers: Sequence[Any], rows: Sequence[int], num_rows: int) -> np.ndarray:
        """``[num_rows, ceil(V / 32)]`` int32 token bitmask: row ``rows[i]`` from ``matchers[i]``,
        the other rows all-allowed (-1). One parallel llguidance call."""
        import llguidance
        import llguidance.numpy as lln

        bitmask = lln.allocate_token_bitmask(num_rows, self.vocab_size)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        lln.fill_next_token_bitmask_par(self._executor, list(zip(matchers, rows)), bitmask)
        return bitmask

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (special tokens as their text)."""
        return bytes(self.lltokenizer.decode_bytes([int(token_id)]))


def consume(matcher: Any, token_id: int) -> str | None:
    """Advance ``matcher`` by the sampled token; the matcher's error text when it rejected it."""
    if matcher.is_stopped():
        return None
    if not matcher.consume_token(int(token_id)) or matcher.is_error():
        return matcher.get_error() or f"token {token_id} does not follow the schema"
    return None


def _schema_error(so: StructuredOutput, reason: str) -> RequestError:
    """400 naming the schema path (JSON pointer) whose value the reason quotes, when one does."""
    hit = next(((p, v) for p, v in _leaves(so.schema, "") if v.lstrip("#") and v.lstrip("#") in reason), None)
    where = f"at {hit[0]} = {hit[1]!r:.60}" if hit is not None else "(path not located; the schema as a whole)"
    return RequestError(
        f"response_format.json_schema {where}: llguidance cannot compile it: {reason.strip()}; expected a "
        "JSON Schema llguidance supports (no look-around in patterns, resolvable $refs, known types). "
        "Fix: simplify or correct that part of the schema.",
        field="response_format",
    )


def _leaves(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """(JSON pointer, text) for every string value of a schema, depth first."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}/{str(k).replace('~', '~0').replace('/', '~1')}"
            if isinstance(v, (dict, list)):
                yield from _leaves(v, p)
            elif isinstance(v, str):
                yield p, v
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{path}/{i}")


__all__ = ["GrammarCompiler", "MAX_CACHED_GRAMMARS", "consume"]
