"""The pre-tokenizer of each ``tokenizer.ggml.pre`` family: llama.cpp's split regexes, as
``tokenizers`` pre-tokenizers.

Source: llama.cpp ``src/llama-vocab.cpp`` (``llama_vocab::impl::load`` maps ``tokenizer.ggml.pre``
to a pre-tokenizer type, ``llm_tokenizer_bpe`` lists that type's split regexes, applied in order,
each one splitting every piece the previous one produced, keeping unmatched gaps as pieces = the
``"isolated"`` behaviour of ``tokenizers.pre_tokenizers.Split``).

transformers only overrides the split for the pre types in its ``GGUF_PRE_TOKENIZER_SPLITS`` and
falls back to plain GPT-2 splitting for the rest. For ``"smollm"`` (and StarCoder, Refact,
Command-R, ...) llama.cpp first isolates every digit (``\\p{N}``), like SmolLM2's own
``tokenizer.json`` (``Digits(individual_digits=True)`` then ``ByteLevel``). We follow llama.cpp:
transformers' GGUF tokenizer gives different ids for digits that follow whitespace (``"  1"``:
transformers ``["Ġ", "Ġ", "1"]``; llama.cpp and SmolLM2's ``tokenizer.json`` ``["ĠĠ", "1"]``).
llama.cpp also sets ``ignore_merges`` (a whole word found in the vocabulary is one token) for the
Llama 3 and Tekken pre types and defaults ``add_bos`` to true for them; we follow it.

Regexes: where llama.cpp quotes the "original regex from tokenizer.json" and then adapts it for
its own regex engine (no ``(?i:...)``), we use the original: ``tokenizers`` (Oniguruma) runs it as
is, and it is what transformers and the model's ``tokenizer.json`` use. Only the ``"smollm"``
family is checked end to end (tests/pipeline/test_tokenizer_gguf.py); the other entries are
copied from the sources above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.model.tokenizer.fields import KEY_PRE, GGUFTokenizerError

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
        [
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "exaone4",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "granite-docling",
        ],
        _GPT2,
    ),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"], _STARCODER
    ),
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"], _LLAMA3
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe"], PreTokenizerSpec((_LLAMA3_SPLIT,))),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"],
        PreTokenizerSpec((_QWEN2_SPLIT,)),
    ),
    "qwen35": PreTokenizerSpec((_QWEN35_SPLIT,)),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], PreTokenizerSpec((_GPT4O_SPLIT,))),
    "tekken": PreTokenizerSpec((_TEKKEN_SPLIT,), ignore_merges=True, default_add_bos=True),
}


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec:
    """The spec for a ``tokenizer.ggml.pre`` value. Raises :class:`GGUFTokenizerError` naming the
    key, the value and the supported values when it is missing or unknown."""
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
            "PRE_TOKENIZER_SPECS in pipeline/model/tokenizer/pre_tokenizer.py."
        )
    return spec


def pre_tokenizer_sequence(spec: PreTokenizerSpec) -> Any:
    """``tokenizers`` pre-tokenizer for ``spec``: its splits ("isolated"), then ``ByteLevel``
    (no prefix space, no built-in regex) mapping each piece to the GPT-2 byte alphabet."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in spec.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
