"""Incremental detokenization: token ids in, text pieces out, never half a character.

Follows vLLM ``detokenize_incrementally`` and Hugging Face ``TextStreamer``: keep two offsets
into the token ids,

    ids:   ... | prefix_offset ........ read_offset | new tokens ...
                 \\__ already emitted (context) __/

decode ``ids[prefix_offset:read_offset]`` and ``ids[prefix_offset:]``; the new text is the
difference. Decoding from a few tokens of context (not token by token) keeps what a decoder does
across token boundaries (byte-level merging, SentencePiece spaces) right. With byte-level BPE a
multi-byte UTF-8 character can be split across tokens; until its last byte arrives, the decode
ends with U+FFFD, so nothing is emitted and the offsets stay put. ``flush()`` emits whatever is
left at the end, except the U+FFFD that stands for a character whose bytes were cut off by the
end of the request (a token limit, a stop token): the text ends before that character, and the
token ids still carry its bytes. Invalid UTF-8 inside the text is kept as U+FFFD.

Only text is produced here; token ids stay in the ``Request``. Stop strings are matched on the
text with ``find_stop`` / ``stop_prefix_len``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET: prompt tokens used as decode context.
_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Streams the text of one request's output tokens.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (the fast Rust tokenizer; no transformers).
        prompt_token_ids: the prompt; its last tokens are decode context, never emitted.
        skip_special_tokens: drop special tokens (EOS...) from the text.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Iterable[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = [int(t) for t in prompt_token_ids]
        self._num_prompt_tokens = len(self._ids)
        self._prefix_offset = max(len(self._ids) - _PROMPT_CONTEXT_TOKENS, 0)
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        self._pieces: list[str] = []

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[self._num_prompt_tokens :]

    @property
    def text(self) -> str:
        """All text emitted so far (``add`` and ``flush`` pieces concatenated)."""
        return "".join(self._pieces)

    def add(self, token_id: int) -> str:
        """Append one output token; return the newly complete text ("" if none yet)."""
        self._ids.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of the request: return any text still held back, without a trailing
        U+FFFD (the incomplete bytes of a character cut off by the end of the request)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(self._prefix_text):
            return ""
        if new_text.endswith(REPLACEMENT_CHAR):
            if not final:
                return ""  # a character is split across tokens: wait for its remaining bytes
            # the request ended inside a character: its bytes will never complete
            new_text = new_text.rstrip(REPLACEMENT_CHAR)
            if len(new_text) <= len(self._prefix_text):
                return ""
        piece = new_text[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        self._pieces.append(piece)
        return piece

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special_tokens)


def find_stop(text: str, stop_strings: Iterable[str], start: int = 0) -> int | None:
    """Index in ``text`` where the earliest stop string begins (at or after ``start``), or None.

    The caller truncates the output text there (the stop string is not part of the output, as
    in vLLM/OpenAI). Pass ``start = max(0, old_len - longest_stop + 1)`` to search only the new
    part of a growing text.
    """
    best: int | None = None
    for stop in stop_strings:
        if not stop:
            continue
        index = text.find(stop, start)
        if index != -1 and (best is None or index < best):
            best = index
    return best


def stop_prefix_len(text: str, stop_strings: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop string (0 if none).

    A streamer holds back that many characters: they may turn into a stop string with the next
    token and must then never reach the client.
    """
    longest = 0
    for stop in stop_strings:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


__all__ = ["IncrementalDetokenizer", "find_stop", "stop_prefix_len", "REPLACEMENT_CHAR"]
