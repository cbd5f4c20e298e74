"""GGUF tokenizer metadata -> one ``tokenizers.Tokenizer``: the stages composed.

``gpt2`` (byte-level BPE): pre-tokenizer spec (``pre_tokenizer.py``) -> vocabulary + merges as a
byte-level BPE model (``bpe.py``) -> splits + ``ByteLevel`` pre-tokenizer -> added/special tokens
and the BOS/EOS post-processor (``special_tokens.py``).

``llama`` (SentencePiece): layout (Gemma, Phi-3 or Llama 2 rules, space prefix) -> vocabulary + merges
(from the file or rebuilt from scores) as a byte-fallback BPE model -> ``Metaspace`` pre-tokenizer
and SentencePiece decoder (``sentencepiece.py``) -> added/special tokens and the post-processor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trtpipe.pipeline.model.tokenizer.bpe import bpe_model, read_tokens
from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_MODEL,
    KEY_PRE,
    GGUFTokenizerError,
    fields_of,
    metadata_value,
    require_value,
)
from trtpipe.pipeline.model.tokenizer.metadata import gguf_tokenizer_metadata
from trtpipe.pipeline.model.tokenizer.pre_tokenizer import pre_tokenizer_sequence, pre_tokenizer_spec
from trtpipe.pipeline.model.tokenizer.sentencepiece import (
    sentencepiece_decoder,
    sentencepiece_layout,
    sentencepiece_model,
    sentencepiece_normalizer,
    sentencepiece_pre_tokenizer,
    sentencepiece_spellings,
)
from trtpipe.pipeline.model.tokenizer.special_tokens import add_gguf_added_tokens, post_processor

if TYPE_CHECKING:  # heavy-ish imports stay lazy: `import trtpipe.pipeline...` must stay cheap
    import tokenizers

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")  # tokenizer.ggml.model values we build
_MODEL_KINDS = {"gpt2": "GPT-2 style byte-level BPE", "llama": "SentencePiece BPE with byte fallback"}


def _check_tokenizer_model(fields: Any) -> str:
    """``tokenizer.ggml.model``; raises :class:`GGUFTokenizerError` unless it is one we build."""
    model = require_value(fields, KEY_MODEL, f"the tokenizer model, one of {list(SUPPORTED_TOKENIZER_MODELS)}")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        supported = ", ".join(f"{name!r} ({_MODEL_KINDS[name]})" for name in SUPPORTED_TOKENIZER_MODELS)
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_MODEL} = {model!r} is not supported; trtpipe builds only {supported} "
            "tokenizers from GGUF ('t5' is a Unigram and 'bert' a WordPiece vocabulary, which it "
            "does not build yet). Fix: build from the Hugging Face model folder, whose "
            "tokenizer.json is used as is."
        )
    return str(model)


def _byte_level_tokenizer(fields: Mapping[str, Any], meta: dict[str, Any]) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, decoders

    spec = pre_tokenizer_spec(metadata_value(fields, KEY_PRE))
    tokens, token_types = read_tokens(fields)
    tok = Tokenizer(bpe_model(fields, tokens, token_types, ignore_merges=spec.ignore_merges))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizer_sequence(spec)
    tok.decoder = decoders.ByteLevel()
    add_gguf_added_tokens(tok, tokens, token_types)
    tok.post_processor = post_processor(meta)
    return tok


def _sentencepiece_tokenizer(fields: Mapping[str, Any], meta: dict[str, Any]) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer

    layout = sentencepiece_layout(fields)
    tokens, token_types = read_tokens(fields)
    spellings = sentencepiece_spellings(tokens, layout)
    unk = meta["unk_token_id"]
    unk_token = spellings[unk] if unk is not None and 0 <= unk < len(spellings) else None
    tok = Tokenizer(sentencepiece_model(fields, spellings, layout, unk_token))
    tok.normalizer = sentencepiece_normalizer(layout)
    tok.pre_tokenizer = sentencepiece_pre_tokenizer(layout)
    tok.decoder = sentencepiece_decoder(layout)
    named = (meta[f"{name}_token_id"] for name in ("bos", "eos", "unk", "pad"))
    special_ids = tuple(i for i in named if i is not None and 0 <= i < len(tokens))
    add_gguf_added_tokens(tok, tokens, token_types, spellings=spellings, special_ids=special_ids)
    tok.post_processor = post_processor(meta, byte_level=False)
    return tok


def tokenizer_from_gguf_fields(reader_or_fields: Any) -> tokenizers.Tokenizer:
    """``tokenizers.Tokenizer`` equivalent to the GGUF's tokenizer.

    ``reader_or_fields``: a ``gguf.GGUFReader``, its ``.fields``, or a plain mapping from
    metadata key to Python value (str, int, float, bool, list[str], list[int], list[float]).

    The result has one id per GGUF token (``get_vocab_size(with_added_tokens=True) ==
    len(tokenizer.ggml.tokens)``), CONTROL tokens as special added tokens (matched whole in text,
    dropped by ``decode(skip_special_tokens=True)``), USER_DEFINED tokens as non-special added
    tokens, and a post-processor that adds BOS (and EOS) only when ``add_bos_token``
    (``add_eos_token``) say so (absent: llama.cpp's default, true for SentencePiece).

    * ``gpt2``: byte-level BPE, no normalizer, the pre type's splits + ``ByteLevel``, a
      ``ByteLevel`` decoder (``bpe.py``, ``pre_tokenizer.py``).
    * ``llama``: SentencePiece BPE with byte fallback, ``Metaspace`` pre-tokenizer, the
      SentencePiece decoder, BOS/EOS/UNK/PAD also special (``sentencepiece.py``): the ids of
      transformers' ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, except that
      ``tokenizer.ggml.add_space_prefix`` is obeyed as in llama.cpp.

    Raises :class:`GGUFTokenizerError` for another tokenizer model (``t5``, ``bert``), an unknown
    pre type (``gpt2``), or missing/inconsistent arrays (each message names the key and the value).
    """
    fields = fields_of(reader_or_fields)
    model = _check_tokenizer_model(fields)
    meta = gguf_tokenizer_metadata(fields)
    if model == "llama":
        return _sentencepiece_tokenizer(fields, meta)
    return _byte_level_tokenizer(fields, meta)
