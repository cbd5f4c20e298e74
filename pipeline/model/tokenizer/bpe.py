"""GGUF vocabulary and merges -> a ``tokenizers`` byte-level BPE model.

Follows transformers ``integrations/gguf/gguf_tokenizer_mapping.py`` (v5; ``GGUFGPTConverter`` in
older releases): the vocabulary is respelled into the GPT-2 byte alphabet when a token is not
already spelled in it (``byte_level_tokenizer``), and merges ``"a b"`` are split on the space.
Where we differ: a CONTROL or USER_DEFINED token spelled outside the byte alphabet (e.g. containing
a space) keeps its raw spelling in the vocabulary, so it stays matchable as a whole and keeps its
id, as in llama.cpp; transformers respells it and drops it from the special tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_MERGES,
    KEY_TOKEN_TYPE,
    KEY_TOKENS,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_USER_DEFINED,
    GGUFTokenizerError,
    metadata_value,
    require_value,
)

ADDED_TOKEN_TYPES = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py; the same as
    transformers ``convert_slow_tokenizer.bytes_to_unicode`` and llama.cpp ``unicode_byte_to_utf8``)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_TO_CHAR = _bytes_to_unicode()  # byte value 0..255 -> its one-character spelling
_BYTE_ALPHABET = frozenset(BYTE_TO_CHAR.values())


def byte_level_spelling(token: str) -> str:
    """A token as the BPE model stores it: itself if already in the byte alphabet, else its UTF-8
    bytes respelled (transformers ``byte_level_tokenizer`` does the same)."""
    if all(c in _BYTE_ALPHABET for c in token):
        return token
    return "".join(BYTE_TO_CHAR[b] for b in token.encode("utf-8"))


def read_tokens(fields: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    """``(tokens, token_types)``, one type per token (NORMAL when the file has no types).

    Raises :class:`GGUFTokenizerError` when the vocabulary is missing or the two arrays differ
    in length."""
    tokens = list(require_value(fields, KEY_TOKENS, "the vocabulary (array of strings)"))
    token_types = list(metadata_value(fields, KEY_TOKEN_TYPE, None) or [TOKEN_TYPE_NORMAL] * len(tokens))
    if len(token_types) != len(tokens):
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_TOKEN_TYPE} has {len(token_types)} entries but {KEY_TOKENS} has "
            f"{len(tokens)}; expected one type per token. Fix: re-convert the model."
        )
    return tokens, token_types


def _vocab(tokens: list[str], token_types: list[int]) -> dict[str, int]:
    """Spelling -> id. Added tokens keep their raw spelling (they are matched in raw text and never
    produced by merges); every other token is stored in the byte alphabet the BPE model works in."""
    vocab = {
        (token if token_type in ADDED_TOKEN_TYPES else byte_level_spelling(token)): token_id
        for token_id, (token, token_type) in enumerate(zip(tokens, token_types))
    }
    if len(vocab) != len(tokens):
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_TOKENS} has {len(tokens)} entries but only {len(vocab)} distinct "
            "spellings; expected every token to be unique. Fix: re-convert the model."
        )
    return vocab


def _merges(fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` ("left right" strings) as pairs; raises naming a bad entry."""
    return parse_merges(require_value(fields, KEY_MERGES, "the BPE merges (array of 'left right' strings)"))


def parse_merges(merges_raw: Sequence[str]) -> list[tuple[str, str]]:
    """GGUF merges ("left right" strings) as pairs; raises :class:`GGUFTokenizerError` naming a bad entry."""
    merges = []
    for index, merge in enumerate(merges_raw):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise GGUFTokenizerError(
                f"GGUF metadata {KEY_MERGES}[{index}] = {merge!r}; expected 'left right' (two "
                "tokens separated by one space). Fix: re-convert the model."
            )
        merges.append((left, right))
    return merges


def bpe_model(fields: Mapping[str, Any], tokens: list[str], token_types: list[int], *, ignore_merges: bool) -> Any:
    """``tokenizers.models.BPE`` over the GGUF vocabulary and merges: no dropout, no unknown-token
    fusion, no byte fallback, no subword prefix/suffix (GPT-2 byte-level BPE).
    ``ignore_merges``: a piece found whole in the vocabulary is one token (llama.cpp, Llama 3)."""
    from tokenizers.models import BPE

    return BPE(
        vocab=_vocab(tokens, token_types),
        merges=_merges(fields),
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=ignore_merges,
    )
