"""A Hugging Face model folder's ``tokenizer.json``, loaded as is (the tokenizer of HF-folder builds)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trtpipe.pipeline.model.tokenizer.fields import GGUFTokenizerError

if TYPE_CHECKING:
    import tokenizers


def tokenizer_from_hf_folder(path: str | os.PathLike[str]) -> tokenizers.Tokenizer:
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
