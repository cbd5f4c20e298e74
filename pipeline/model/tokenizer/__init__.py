"""Build a Hugging Face ``tokenizers.Tokenizer`` from a GGUF file's tokenizer metadata.

A GGUF has no ``tokenizer.json``: it stores the vocabulary, the merges, the token types and the
special token ids as metadata under llama.cpp's key names (``tokenizer.ggml.*``), and names the
pre-tokenizer only by a short string (``tokenizer.ggml.pre``, e.g. ``"smollm"``). This package
turns that back into a byte-level BPE tokenizer that the runtime can load from a
``tokenizer.json`` without transformers, llama.cpp or torch.

Supported now: ``tokenizer.ggml.model == "gpt2"`` (GPT-2 style byte-level BPE: SmolLM, Llama 3,
Qwen 2, Mistral Tekken, ...) and ``"llama"`` (SentencePiece BPE with byte fallback: Llama 2,
Gemma 1-3, Phi-3, ...). Unigram (``"t5"``) and WordPiece (``"bert"``) vocabularies raise
:class:`GGUFTokenizerError`.

One concept per file (each names its sources and where we deliberately differ from them):

* ``fields.py`` — llama.cpp's key names, reading values from a ``GGUFReader`` or a plain mapping,
  the one end-of-generation rule (:func:`end_of_generation_ids`: EOS, EOT, EOM).
* ``metadata.py`` — the facts a runtime needs (special ids and text, BOS/EOS insertion, template).
* ``pre_tokenizer.py`` — llama.cpp's split regexes per ``tokenizer.ggml.pre`` family.
* ``bpe.py`` — vocabulary (GPT-2 byte alphabet) and merges -> the BPE model.
* ``sentencepiece.py`` — SentencePiece vocabularies: byte-fallback BPE (merges from the file or
  rebuilt from scores), ``Metaspace`` pre-tokenizer, decoder, the Gemma rules.
* ``special_tokens.py`` — CONTROL/USER_DEFINED added tokens and the BOS/EOS post-processor.
* ``from_gguf.py`` — :func:`tokenizer_from_gguf_fields`, the stages composed.
* ``hf_folder.py`` — :func:`tokenizer_from_hf_folder`, a model folder's ``tokenizer.json`` as is.

Only the ``"smollm"`` family is checked end to end against transformers and SmolLM2's own
``tokenizer.json`` (tests/pipeline/test_tokenizer_gguf.py): ids equal transformers' everywhere
except digits after whitespace, where we follow llama.cpp (see ``pre_tokenizer.py``).
SentencePiece is checked against transformers on Gemma 3 270M's GGUF and on synthetic Llama-2
style files (tests/pipeline/test_tokenizer_sentencepiece.py); ``add_space_prefix`` is obeyed
where transformers ignores it (see ``sentencepiece.py``).
"""

from trtpipe.pipeline.model.tokenizer.bpe import BYTE_TO_CHAR, byte_level_spelling
from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_ADD_BOS,
    KEY_ADD_EOS,
    KEY_BOS_ID,
    KEY_CHAT_TEMPLATE,
    KEY_EOM_ID,
    KEY_EOS_ID,
    KEY_EOT_ID,
    KEY_MERGES,
    KEY_MODEL,
    KEY_PAD_ID,
    KEY_PRE,
    KEY_TOKEN_TYPE,
    KEY_TOKENS,
    KEY_UNK_ID,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_USER_DEFINED,
    GGUFTokenizerError,
    end_of_generation_ids,
    metadata_value,
)
from trtpipe.pipeline.model.tokenizer.from_gguf import SUPPORTED_TOKENIZER_MODELS, tokenizer_from_gguf_fields
from trtpipe.pipeline.model.tokenizer.hf_folder import tokenizer_from_hf_folder
from trtpipe.pipeline.model.tokenizer.metadata import gguf_tokenizer_metadata
from trtpipe.pipeline.model.tokenizer.pre_tokenizer import PRE_TOKENIZER_SPECS, PreTokenizerSpec, pre_tokenizer_spec
from trtpipe.pipeline.model.tokenizer.sentencepiece import SentencePieceLayout, derive_merges, sentencepiece_layout

__all__ = [
    "BYTE_TO_CHAR",
    "KEY_ADD_BOS",
    "KEY_ADD_EOS",
    "KEY_BOS_ID",
    "KEY_CHAT_TEMPLATE",
    "KEY_EOM_ID",
    "KEY_EOS_ID",
    "KEY_EOT_ID",
    "KEY_MERGES",
    "KEY_MODEL",
    "KEY_PAD_ID",
    "KEY_PRE",
    "KEY_TOKEN_TYPE",
    "KEY_TOKENS",
    "KEY_UNK_ID",
    "PRE_TOKENIZER_SPECS",
    "SUPPORTED_TOKENIZER_MODELS",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_USER_DEFINED",
    "GGUFTokenizerError",
    "PreTokenizerSpec",
    "SentencePieceLayout",
    "byte_level_spelling",
    "derive_merges",
    "end_of_generation_ids",
    "gguf_tokenizer_metadata",
    "metadata_value",
    "pre_tokenizer_spec",
    "sentencepiece_layout",
    "tokenizer_from_gguf_fields",
    "tokenizer_from_hf_folder",
]
