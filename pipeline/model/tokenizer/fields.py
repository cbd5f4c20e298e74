"""GGUF tokenizer metadata as llama.cpp names it, read from a ``gguf.GGUFReader`` or a plain mapping.

Key names follow llama.cpp ``gguf-py/gguf/constants.py`` (``Keys.Tokenizer``); token types follow
``llama_token_type`` / ``gguf.TokenType``. Every reader here accepts a ``GGUFReader``, its
``.fields`` (key -> ``ReaderField``), or a mapping from key to a plain Python value (str, int,
bool, list[str], list[int]), which is what the synthetic tests pass.

Also home of the one end-of-generation rule (:func:`end_of_generation_ids`), used by the GGUF
model config (``pipeline/model/gguf.py``) and the tokenizer metadata alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtpipe.plugins.core.errors import TrtpipeError


class GGUFTokenizerError(TrtpipeError, ValueError):
    """The GGUF's tokenizer metadata is missing, inconsistent, or of a type we cannot build."""


# GGUF metadata keys (llama.cpp gguf-py/gguf/constants.py, Keys.Tokenizer).
KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_SCORES = "tokenizer.ggml.scores"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_BOS_ID = "tokenizer.ggml.bos_token_id"
KEY_EOS_ID = "tokenizer.ggml.eos_token_id"
KEY_EOT_ID = "tokenizer.ggml.eot_token_id"
KEY_EOM_ID = "tokenizer.ggml.eom_token_id"
KEY_UNK_ID = "tokenizer.ggml.unknown_token_id"
KEY_PAD_ID = "tokenizer.ggml.padding_token_id"
KEY_ADD_BOS = "tokenizer.ggml.add_bos_token"
KEY_ADD_EOS = "tokenizer.ggml.add_eos_token"
KEY_ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"
KEY_ARCHITECTURE = "general.architecture"

# llama.cpp llama_token_type / gguf TokenType values.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6  # SentencePiece byte-fallback pieces <0x00>..<0xFF>


def fields_of(reader_or_fields: Any) -> Mapping[str, Any]:
    """A ``GGUFReader`` (its ``.fields``) or a mapping key -> ``ReaderField`` or plain value.
    Raises TypeError naming the type for anything else."""
    fields = getattr(reader_or_fields, "fields", reader_or_fields)
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"expected a gguf.GGUFReader or a mapping of GGUF metadata, got {type(reader_or_fields).__name__}"
        )
    return fields


def metadata_value(reader_or_fields: Any, key: str, default: Any = None) -> Any:
    """Plain Python value of a metadata key (``ReaderField.contents()`` for gguf reader fields);
    ``default`` when the key is absent."""
    fields = fields_of(reader_or_fields)
    if key not in fields:
        return default
    field = fields[key]
    contents = getattr(field, "contents", None)
    return contents() if callable(contents) else field


def require_value(fields: Mapping[str, Any], key: str, what: str) -> Any:
    """The value of ``key``; raises :class:`GGUFTokenizerError` naming the key and ``what`` was
    expected when it is missing."""
    value = metadata_value(fields, key)
    if value is None:
        raise GGUFTokenizerError(
            f"GGUF metadata key {key!r} is missing; expected {what}. "
            "Fix: re-convert the model with llama.cpp's convert_hf_to_gguf.py, or build from the "
            "Hugging Face folder (tokenizer.json) instead."
        )
    return value


def optional_id(fields: Mapping[str, Any], key: str) -> int | None:
    """A token id key as int, or None when the file does not set it."""
    value = metadata_value(fields, key)
    return None if value is None else int(value)


def token_text(fields: Mapping[str, Any], token_id: int | None) -> str | None:
    """Text of one token without converting the whole 49k-entry array; None when the id is None
    or outside the vocabulary."""
    if token_id is None or KEY_TOKENS not in fields:
        return None
    field = fields[KEY_TOKENS]
    if hasattr(field, "parts") and hasattr(field, "data"):  # gguf ReaderField: data indexes parts
        if not 0 <= token_id < len(field.data):
            return None
        return bytes(field.parts[field.data[token_id]]).decode("utf-8")
    return field[token_id] if 0 <= token_id < len(field) else None


def vocab_size(fields: Mapping[str, Any]) -> int:
    """Number of entries of ``tokenizer.ggml.tokens`` (0 when absent), without converting them."""
    tokens_field = fields.get(KEY_TOKENS)
    return len(tokens_field.data) if hasattr(tokens_field, "data") else len(tokens_field or ())


def end_of_generation_ids(reader_or_fields: Any) -> tuple[int, ...]:
    """The token ids that end a generation: EOS, then EOT and EOM when the file names them.

    ``reader_or_fields``: a ``gguf.GGUFReader``, its ``.fields``, or a mapping key -> value.
    Returns the ids of ``tokenizer.ggml.eos_token_id``, ``eot_token_id`` (end of turn) and
    ``eom_token_id`` (end of message, e.g. Llama 3.1's ``<|eom_id|>`` after a tool call) in that
    order, without repeats; ``()`` when none is set.

    Follows llama.cpp ``src/llama-vocab.cpp``: ``llama_vocab::is_eog`` is true for every id in
    ``special_eog_ids``, and loading always inserts the EOS, EOT and EOM ids there. llama.cpp also
    adds tokens found by their text (``<|im_end|>``, ``<|endoftext|>``, ...), a workaround its own
    comment calls "not ideal"; we read only the ids the file declares, which is what transformers'
    ``generation_config.eos_token_id`` holds for the models we check (SmolLM2: ``(2,)``).
    This is the one EOS rule of trtpipe: the GGUF model config and the tokenizer metadata use it.
    """
    fields = fields_of(reader_or_fields)
    ids = (optional_id(fields, key) for key in (KEY_EOS_ID, KEY_EOT_ID, KEY_EOM_ID))
    return tuple(dict.fromkeys(token_id for token_id in ids if token_id is not None))
