"""GGUF tokenizer metadata -> one ``tokenizers.Tokenizer``: the stages composed.

model check -> pre-tokenizer spec (``pre_tokenizer.py``) -> vocabulary + merges as a byte-level BPE
model (``bpe.py``) -> splits + ``ByteLevel`` pre-tokenizer -> added/special tokens and the BOS/EOS
post-processor (``special_tokens.py``).
"""

from __future__ import annotations

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
from trtpipe.pipeline.model.tokenizer.special_tokens import add_gguf_added_tokens, post_processor

if TYPE_CHECKING:  # heavy-ish imports stay lazy: `import trtpipe.pipeline...` must stay cheap
    import tokenizers

SUPPORTED_TOKENIZER_MODELS = ("gpt2",)


def _check_tokenizer_model(fields: Any) -> None:
    """Raise :class:`GGUFTokenizerError` unless ``tokenizer.ggml.model`` is one we build."""
    model = require_value(fields, KEY_MODEL, f"the tokenizer model, one of {list(SUPPORTED_TOKENIZER_MODELS)}")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_MODEL} = {model!r} is not supported; trtpipe builds only "
            f"{list(SUPPORTED_TOKENIZER_MODELS)} (GPT-2 style byte-level BPE) tokenizers from GGUF "
            "for now ('llama' is SentencePiece, 't5' Unigram, 'bert' WordPiece). Fix: build from "
            "the Hugging Face model folder, whose tokenizer.json is used as is."
        )


def tokenizer_from_gguf_fields(reader_or_fields: Any) -> tokenizers.Tokenizer:
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
    from tokenizers import Tokenizer, decoders

    fields = fields_of(reader_or_fields)
    _check_tokenizer_model(fields)
    spec = pre_tokenizer_spec(metadata_value(fields, KEY_PRE))
    meta = gguf_tokenizer_metadata(fields)
    tokens, token_types = read_tokens(fields)

    tok = Tokenizer(bpe_model(fields, tokens, token_types, ignore_merges=spec.ignore_merges))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizer_sequence(spec)
    tok.decoder = decoders.ByteLevel()
    add_gguf_added_tokens(tok, tokens, token_types)
    tok.post_processor = post_processor(meta)
    return tok
