"""The tokenizer facts a runtime needs, read from GGUF metadata (no vocabulary work): special ids
and their text, BOS/EOS insertion, the chat template.

``add_bos_token`` defaults follow llama.cpp ``src/llama-vocab.cpp`` (``llama_vocab::impl::load``):
true for SentencePiece (``"llama"``) vocabularies and for the pre types whose
:class:`~trtpipe.pipeline.model.tokenizer.pre_tokenizer.PreTokenizerSpec` says so.
"""

from __future__ import annotations

from typing import Any

from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_ADD_BOS,
    KEY_ADD_EOS,
    KEY_BOS_ID,
    KEY_CHAT_TEMPLATE,
    KEY_EOS_ID,
    KEY_MODEL,
    KEY_PAD_ID,
    KEY_PRE,
    KEY_UNK_ID,
    end_of_generation_ids,
    fields_of,
    metadata_value,
    optional_id,
    token_text,
    vocab_size,
)
from trtpipe.pipeline.model.tokenizer.pre_tokenizer import PRE_TOKENIZER_SPECS


def gguf_tokenizer_metadata(reader_or_fields: Any) -> dict[str, Any]:
    """The tokenizer facts a runtime needs, read from GGUF metadata (no vocabulary work).

    Returns a dict with keys:
      ``tokenizer_model`` (str, ``tokenizer.ggml.model``), ``pre_tokenizer`` (str | None),
      ``vocab_size`` (int), ``bos_token_id`` / ``eos_token_id`` / ``unk_token_id`` /
      ``pad_token_id`` (int | None), ``eos_token_ids`` (tuple[int, ...]: the ids that end a
      generation, :func:`~trtpipe.pipeline.model.tokenizer.fields.end_of_generation_ids`),
      ``bos_token`` / ``eos_token`` (their text, for chat templates; None when absent),
      ``add_bos_token`` / ``add_eos_token`` (bool; when the key is absent, llama.cpp's default for
      the type: BOS for SentencePiece, Llama 3 and Tekken), ``chat_template`` (str | None).
    """
    fields = fields_of(reader_or_fields)
    model = str(metadata_value(fields, KEY_MODEL, ""))
    pre = metadata_value(fields, KEY_PRE)
    spec = PRE_TOKENIZER_SPECS.get(pre) if pre is not None else None
    default_add_bos = model == "llama" or (spec is not None and spec.default_add_bos)
    bos_id = optional_id(fields, KEY_BOS_ID)
    eos_id = optional_id(fields, KEY_EOS_ID)
    return {
        "tokenizer_model": model,
        "pre_tokenizer": pre,
        "vocab_size": vocab_size(fields),
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "unk_token_id": optional_id(fields, KEY_UNK_ID),
        "pad_token_id": optional_id(fields, KEY_PAD_ID),
        "eos_token_ids": end_of_generation_ids(fields),
        "bos_token": token_text(fields, bos_id),
        "eos_token": token_text(fields, eos_id),
        "add_bos_token": bool(metadata_value(fields, KEY_ADD_BOS, default_add_bos)),
        "add_eos_token": bool(metadata_value(fields, KEY_ADD_EOS, False)),
        "chat_template": metadata_value(fields, KEY_CHAT_TEMPLATE),
    }
