"""Build a Hugging Face ``tokenizers.Tokenizer`` from a GGUF file's tokenizer metadata.

A GGUF has no ``tokenizer.json``: it stores the vocabulary, the merges, the token types and the
special token ids as metadata under llama.cpp's key names (``tokenizer.ggml.*``), and names the
pre-tokenizer only by a short string (``tokenizer.ggml.pre``, e.g. ``"smollm"``). This module turns
that back into a byte-level BPE tokenizer that the runtime can load from a ``tokenizer.json``
without transformers, llama.cpp or torch.

Supported now: ``tokenizer.ggml.model == "gpt2"`` (GPT-2 style byte-level BPE: SmolLM, Llama 3,
Qwen 2, Mistral Tekken, ...). SentencePiece (``"llama"``), Unigram (``"t5"``) and WordPiece
(``"bert"``) vocabularies raise :class:`GGUFTokenizerError`.

Sources, and where we deliberately differ:

* transformers ``integrations/gguf/gguf_tokenizer_mapping.py`` (v5; ``GGUFGPTConverter`` in
  older releases): vocabulary respelled into the GPT-2 byte alphabet when a token is not already
  spelled in it (``byte_level_tokenizer``), merges ``"a b"`` split on the space, CONTROL (3)
  tokens added as special tokens and USER_DEFINED (4) tokens as plain added tokens
  (``add_gguf_special_tokens``), ``ByteLevel`` decoder, BOS added by the post-processor only when
  ``add_bos_token`` (``convert_slow_tokenizer.GPT2Converter``).
* llama.cpp ``src/llama-vocab.cpp`` (``llama_vocab::impl::load`` maps ``tokenizer.ggml.pre`` to a
  pre-tokenizer type, ``llm_tokenizer_bpe`` lists that type's split regexes, applied in order, each
  one splitting every piece the previous one produced, keeping unmatched gaps as pieces = the
  ``"isolated"`` behaviour of ``tokenizers.pre_tokenizers.Split``).

  transformers only overrides the split for the pre types in its ``GGUF_PRE_TOKENIZER_SPLITS``
  and falls back to plain GPT-2 splitting for the rest. For ``"smollm"`` (and StarCoder,
  Refact, Command-R, ...) llama.cpp first isolates every digit (``\\p{N}``), like SmolLM2's own
  ``tokenizer.json`` (``Digits(individual_digits=True)`` then ``ByteLevel``). We follow llama.cpp:
  transformers' GGUF tokenizer gives different ids for digits that follow whitespace
  (``"  1"``: transformers ``["Ġ", "Ġ", "1"]``; llama.cpp and SmolLM2's ``tokenizer.json``
  ``["ĠĠ", "1"]``). Everywhere else the ids equal transformers'.
* llama.cpp also sets ``ignore_merges`` (a whole word found in the vocabulary is one token) for
  the Llama 3 and Tekken pre types and defaults ``add_bos`` to true for them; we follow it.
* A CONTROL or USER_DEFINED token spelled outside the byte alphabet (e.g. containing a space)
  keeps its raw spelling in the vocabulary, so it stays matchable as a whole and keeps its id,
  as in llama.cpp. transformers respells it and drops it from the special tokens.

Regexes: where llama.cpp quotes the "original regex from tokenizer.json" and then adapts it for
its own regex engine (no ``(?i:...)``), we use the original: ``tokenizers`` (Oniguruma) runs it
as is, and it is what transformers and the model's ``tokenizer.json`` use. Only the ``"smollm"``
family is checked end to end (tests/pipeline/test_tokenizer_gguf.py); the other entries are
copied from the sources above.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtpipe.plugins.errors import TrtpipeError

if TYPE_CHECKING:  # heavy-ish imports stay lazy: `import trtpipe.pipeline...` must stay cheap
    import tokenizers


class GGUFTokenizerError(TrtpipeError, ValueError):
    """The GGUF's tokenizer metadata is missing, inconsistent, or of a type we cannot build."""


# GGUF metadata keys (llama.cpp gguf-py/gguf/constants.py, Keys.Tokenizer).
KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_BOS_ID = "tokenizer.ggml.bos_token_id"
KEY_EOS_ID = "tokenizer.ggml.eos_token_id"
KEY_EOT_ID = "tokenizer.ggml.eot_token_id"
KEY_EOM_ID = "tokenizer.ggml.eom_token_id"
KEY_UNK_ID = "tokenizer.ggml.unknown_token_id"
KEY_PAD_ID = "tokenizer.ggml.padding_token_id"
KEY_ADD_BOS = "tokenizer.ggml.add_bos_token"
KEY_ADD_EOS = "tokenizer.ggml.add_eos_token"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# llama.cpp llama_token_type / gguf TokenType values.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

SUPPORTED_TOKENIZER_MODELS = ("gpt2",)


# --- pre-tokenizer split regexes -------------------------------------------------------------
# llama.cpp llm_tokenizer_bpe, LLAMA_VOCAB_PRE_TYPE_GPT2 (the GPT-2 regex without the trailing
# `|\s+`: with "isolated" splitting an unmatched whitespace gap is kept as its own piece anyway).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Originals from the models' tokenizer.json, as quoted in llama.cpp and used by transformers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How llama.cpp pre-tokenizes one ``tokenizer.ggml.pre`` family.

    ``splits`` are applied in order with "isolated" behaviour (matches and gaps both kept), then
    each piece is mapped to the GPT-2 byte alphabet. ``ignore_merges``: a piece that is itself a
    vocabulary entry becomes that one token. ``default_add_bos``: llama.cpp's value when the file
    has no ``tokenizer.ggml.add_bos_token``.
    """

    splits: tuple[str, ...]
    ignore_merges: bool = False
    default_add_bos: bool = False


_GPT2 = PreTokenizerSpec((_GPT2_SPLIT,))
_STARCODER = PreTokenizerSpec((r"\p{N}", _GPT2_SPLIT))
_LLAMA3 = PreTokenizerSpec((_LLAMA3_SPLIT,), ignore_merges=True, default_add_bos=True)

# tokenizer.ggml.pre value -> spec; the groups follow llama.cpp's `case` labels.
PRE_TOKENIZER_SPECS: dict[str, PreTokenizerSpec] = {
    **dict.fromkeys(
        ["gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4", "gigachat", "a.x-4.0",
         "mellum", "granite-docling"],
        _GPT2,
    ),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
         "mellum2"],
        _STARCODER,
    ),
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        _LLAMA3,
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe"], PreTokenizerSpec((_LLAMA3_SPLIT,))),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
         "solar-open"],
        PreTokenizerSpec((_QWEN2_SPLIT,)),
    ),
    "qwen35": PreTokenizerSpec((_QWEN35_SPLIT,)),
    **dict.fromkeys(
        ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], PreTokenizerSpec((_GPT4O_SPLIT,))
    ),
    "tekken": PreTokenizerSpec((_TEKKEN_SPLIT,), ignore_merges=True, default_add_bos=True),
}


# --- reading fields ----------------------------------------------------------------------------
def _fields_of(reader_or_fields: Any) -> Mapping[str, Any]:
    """A ``GGUFReader`` (its ``.fields``) or a mapping key -> ``ReaderField`` or plain value."""
    fields = getattr(reader_or_fields, "fields", reader_or_fields)
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"expected a gguf.GGUFReader or a mapping of GGUF metadata, got {type(reader_or_fields).__name__}"
        )
    return fields


def _value(fields: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """Plain Python value of a metadata key (``ReaderField.contents()`` for gguf reader fields)."""
    if key not in fields:
        return default
    field = fields[key]
    contents = getattr(field, "contents", None)
    return contents() if callable(contents) else field


def _require(fields: Mapping[str, Any], key: str, what: str) -> Any:
    value = _value(fields, key)
    if value is None:
        raise GGUFTokenizerError(
            f"GGUF metadata key {key!r} is missing; expected {what}. "
            "Fix: re-convert the model with llama.cpp's convert_hf_to_gguf.py, or build from the "
            "Hugging Face folder (tokenizer.json) instead."
        )
    return value


def _token_text(fields: Mapping[str, Any], token_id: int | None) -> str | None:
    """Text of one token without converting the whole 49k-entry array."""
    if token_id is None or KEY_TOKENS not in fields:
        return None
    field = fields[KEY_TOKENS]
    if hasattr(field, "parts") and hasattr(field, "data"):  # gguf ReaderField: data indexes parts
        if not 0 <= token_id < len(field.data):
            return None
        return bytes(field.parts[field.data[token_id]]).decode("utf-8")
    return field[token_id] if 0 <= token_id < len(field) else None


def _optional_id(fields: Mapping[str, Any], key: str) -> int | None:
    value = _value(fields, key)
    return None if value is None else int(value)


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
    fields = _fields_of(reader_or_fields)
    ids = (_optional_id(fields, key) for key in (KEY_EOS_ID, KEY_EOT_ID, KEY_EOM_ID))
    return tuple(dict.fromkeys(token_id for token_id in ids if token_id is not None))


def gguf_tokenizer_metadata(reader_or_fields: Any) -> dict[str, Any]:
    """The tokenizer facts a runtime needs, read from GGUF metadata (no vocabulary work).

    Returns a dict with keys:
      ``tokenizer_model`` (str, ``tokenizer.ggml.model``), ``pre_tokenizer`` (str | None),
      ``vocab_size`` (int), ``bos_token_id`` / ``eos_token_id`` / ``unk_token_id`` /
      ``pad_token_id`` (int | None), ``eos_token_ids`` (tuple[int, ...]: the ids that end a
      generation, :func:`end_of_generation_ids`), ``bos_token`` / ``eos_token``
      (their text, for chat templates; None when absent), ``add_bos_token`` / ``add_eos_token``
      (bool; when the key is absent, llama.cpp's default for the type: BOS for SentencePiece,
      Llama 3 and Tekken), ``chat_template`` (str | None).
    """
    fields = _fields_of(reader_or_fields)
    model = str(_value(fields, KEY_MODEL, ""))
    pre = _value(fields, KEY_PRE)
    spec = PRE_TOKENIZER_SPECS.get(pre) if pre is not None else None
    default_add_bos = model == "llama" or (spec is not None and spec.default_add_bos)
    bos_id = _optional_id(fields, KEY_BOS_ID)
    eos_id = _optional_id(fields, KEY_EOS_ID)
    tokens_field = fields.get(KEY_TOKENS)
    vocab_size = len(tokens_field.data) if hasattr(tokens_field, "data") else len(tokens_field or ())
    return {
        "tokenizer_model": model,
        "pre_tokenizer": pre,
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "unk_token_id": _optional_id(fields, KEY_UNK_ID),
        "pad_token_id": _optional_id(fields, KEY_PAD_ID),
        "eos_token_ids": end_of_generation_ids(fields),
        "bos_token": _token_text(fields, bos_id),
        "eos_token": _token_text(fields, eos_id),
        "add_bos_token": bool(_value(fields, KEY_ADD_BOS, default_add_bos)),
        "add_eos_token": bool(_value(fields, KEY_ADD_EOS, False)),
        "chat_template": _value(fields, KEY_CHAT_TEMPLATE),
    }


# --- building ----------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py; the same as
    transformers ``convert_slow_tokenizer.bytes_to_unicode`` and llama.cpp ``unicode_byte_to_utf8``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_BYTE_TO_CHAR = _bytes_to_unicode()
_BYTE_ALPHABET = frozenset(_BYTE_TO_CHAR.values())


def _byte_level_spelling(token: str) -> str:
    """A token as the BPE model stores it: itself if already in the byte alphabet, else its UTF-8
    bytes respelled (transformers ``byte_level_tokenizer`` does the same)."""
    if all(c in _BYTE_ALPHABET for c in token):
        return token
    return "".join(_BYTE_TO_CHAR[b] for b in token.encode("utf-8"))


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec:
    """The spec for a ``tokenizer.ggml.pre`` value; raises naming the supported values."""
    if pre is None:
        raise GGUFTokenizerError(
            f"GGUF metadata key {KEY_PRE!r} is missing; llama.cpp then falls back to a 'default' "
            "split and warns that generation quality will be degraded. Expected one of "
            f"{sorted(PRE_TOKENIZER_SPECS)}. Fix: re-convert the model with a current "
            "convert_hf_to_gguf.py, or build from the Hugging Face folder (tokenizer.json)."
        )
    spec = PRE_TOKENIZER_SPECS.get(pre)
    if spec is None:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_PRE} = {pre!r} is not a pre-tokenizer trtpipe knows; expected one "
            f"of {sorted(PRE_TOKENIZER_SPECS)}. Fix: build from the Hugging Face folder "
            "(tokenizer.json), or add its split regexes from llama.cpp src/llama-vocab.cpp to "
            "PRE_TOKENIZER_SPECS in trtpipe/pipeline/tokenizer_gguf.py."
        )
    return spec


def tokenizer_from_gguf_fields(reader_or_fields: Any) -> "tokenizers.Tokenizer":
    """Byte-level BPE ``tokenizers.Tokenizer`` equivalent to the GGUF's tokenizer.

    ``reader_or_fields``: a ``gguf.GGUFReader``, its ``.fields``, or a plain mapping from
    metadata key to Python value (str, int, bool, list[str], list[int]).

    The result has one id per GGUF token (``get_vocab_size(with_added_tokens=True) ==
    len(tokenizer.ggml.tokens)``), CONTROL tokens as special added tokens (matched whole in text,
    dropped by ``decode(skip_special_tokens=True)``), USER_DEFINED tokens as non-special added
    tokens, no normalizer, the pre type's splits + ``ByteLevel``, a ``ByteLevel`` decoder and a
    post-processor that adds BOS (and EOS) only when ``add_bos_token`` (``add_eos_token``) say so.

    Raises :class:`GGUFTokenizerError` for a non-``gpt2`` tokenizer model, an unknown pre type,
    or missing/inconsistent arrays (each message names the key and the value).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    fields = _fields_of(reader_or_fields)
    model = _require(fields, KEY_MODEL, f"the tokenizer model, one of {list(SUPPORTED_TOKENIZER_MODELS)}")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_MODEL} = {model!r} is not supported; trtpipe builds only "
            f"{list(SUPPORTED_TOKENIZER_MODELS)} (GPT-2 style byte-level BPE) tokenizers from GGUF "
            "for now ('llama' is SentencePiece, 't5' Unigram, 'bert' WordPiece). Fix: build from "
            "the Hugging Face model folder, whose tokenizer.json is used as is."
        )
    pre = _value(fields, KEY_PRE)
    spec = pre_tokenizer_spec(pre)
    meta = gguf_tokenizer_metadata(fields)

    tokens = list(_require(fields, KEY_TOKENS, "the vocabulary (array of strings)"))
    n_tokens = len(tokens)
    token_types = list(_value(fields, KEY_TOKEN_TYPE, None) or [TOKEN_TYPE_NORMAL] * n_tokens)
    if len(token_types) != n_tokens:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_TOKEN_TYPE} has {len(token_types)} entries but {KEY_TOKENS} has "
            f"{n_tokens}; expected one type per token. Fix: re-convert the model."
        )
    merges_raw = _require(fields, KEY_MERGES, "the BPE merges (array of 'left right' strings)")

    added_types = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    # Added tokens keep their raw spelling (they are matched in raw text and never produced by
    # merges); every other token is stored in the byte alphabet the BPE model works in.
    vocab = {
        (token if token_type in added_types else _byte_level_spelling(token)): token_id
        for token_id, (token, token_type) in enumerate(zip(tokens, token_types))
    }
    if len(vocab) != n_tokens:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_TOKENS} has {n_tokens} entries but only {len(vocab)} distinct "
            "spellings; expected every token to be unique. Fix: re-convert the model."
        )
    merges = []
    for index, merge in enumerate(merges_raw):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise GGUFTokenizerError(
                f"GGUF metadata {KEY_MERGES}[{index}] = {merge!r}; expected 'left right' (two "
                "tokens separated by one space). Fix: re-convert the model."
            )
        merges.append((left, right))

    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=spec.ignore_merges,
        )
    )
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in spec.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()

    control = [AddedToken(t, normalized=False, special=True)
               for t, tt in zip(tokens, token_types) if tt == TOKEN_TYPE_CONTROL]
    user_defined = [AddedToken(t, normalized=False, special=False)
                    for t, tt in zip(tokens, token_types) if tt == TOKEN_TYPE_USER_DEFINED]
    if control:
        tok.add_special_tokens(control)
    if user_defined:
        tok.add_tokens(user_defined)
    # Adding a token whose content is not in the model vocabulary would append a new id past the
    # model's embedding table: check that none did.
    if tok.get_vocab_size(with_added_tokens=True) != n_tokens:
        raise GGUFTokenizerError(
            f"building the tokenizer from {KEY_TOKENS} ({n_tokens} tokens) produced "
            f"{tok.get_vocab_size(with_added_tokens=True)} ids; expected {n_tokens}. "
            "This is a trtpipe bug; please report it with the GGUF's tokenizer metadata."
        )

    tok.post_processor = _post_processor(meta, processors)
    return tok


def _post_processor(meta: dict[str, Any], processors: Any) -> Any:
    """BOS/EOS template when the file asks for them (the id must exist), else the no-op
    ``ByteLevel(trim_offsets=False)`` that transformers' GPT2Converter uses.

    Pairs follow Hugging Face's Llama convention: ``BOS A EOS BOS B EOS`` (each part optional).
    """
    ends: dict[str, str] = {}
    special = []
    for name, key in (("bos", KEY_ADD_BOS), ("eos", KEY_ADD_EOS)):
        if not meta[f"add_{name}_token"]:
            continue
        token_id, text = meta[f"{name}_token_id"], meta[f"{name}_token"]
        if token_id is None or text is None:
            raise GGUFTokenizerError(
                f"GGUF metadata {key} is true but tokenizer.ggml.{name}_token_id is missing or out "
                f"of range ({token_id!r}); expected a valid token id. Fix: re-convert the model."
            )
        ends[name] = text
        special.append((text, token_id))
    if not special:
        return processors.ByteLevel(trim_offsets=False)

    def part(seq: str, type_id: int) -> list[str]:
        bos = [f"{ends['bos']}:{type_id}"] if "bos" in ends else []
        eos = [f"{ends['eos']}:{type_id}"] if "eos" in ends else []
        return [*bos, f"${seq}:{type_id}", *eos]

    return processors.TemplateProcessing(
        single=part("A", 0), pair=part("A", 0) + part("B", 1), special_tokens=special
    )


def tokenizer_from_gguf_file(path: str | os.PathLike[str]) -> tuple["tokenizers.Tokenizer", dict[str, Any]]:
    """Open a GGUF (``gguf.GGUFReader``, a few seconds for a 49k vocabulary) and return
    ``(tokenizer, gguf_tokenizer_metadata)``. Pass an already open reader to
    :func:`tokenizer_from_gguf_fields` instead when the model loader has one."""
    from gguf import GGUFReader

    reader = GGUFReader(os.fspath(path))
    return tokenizer_from_gguf_fields(reader), gguf_tokenizer_metadata(reader)


def tokenizer_from_hf_folder(path: str | os.PathLike[str]) -> "tokenizers.Tokenizer":
    """``tokenizer.json`` of a Hugging Face model folder (or the file itself), loaded as is.

    Raises :class:`GGUFTokenizerError` (a TrtpipeError) naming the path when the file is missing
    or is not a valid tokenizers serialization.
    """
    from tokenizers import Tokenizer

    path = os.fspath(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise GGUFTokenizerError(
            f"tokenizer file {file!r} does not exist; expected a Hugging Face model folder with a "
            "tokenizer.json (fast tokenizer). Fix: download the full model folder, or save one with "
            "transformers: AutoTokenizer.from_pretrained(...).save_pretrained(folder)."
        )
    try:
        return Tokenizer.from_file(file)
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON / unknown fields
        raise GGUFTokenizerError(
            f"tokenizer file {file!r} could not be loaded ({exc}); expected a tokenizers JSON "
            "serialization. Fix: re-save it with a current transformers/tokenizers."
        ) from exc

