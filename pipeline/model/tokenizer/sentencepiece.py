"""GGUF SentencePiece vocabularies (``tokenizer.ggml.model == "llama"``) -> a ``tokenizers`` BPE
model with byte fallback, its pre-tokenizer and its decoder.

A GGUF SentencePiece vocabulary is the ``.model`` file's pieces as llama.cpp writes them
(``convert_hf_to_gguf.py`` ``_create_vocab_sentencepiece``): ``tokens`` spelled with ``▁`` for a
space, ``scores`` (BPE: minus the merge rank), ``token_type`` (NORMAL, UNKNOWN, CONTROL,
USER_DEFINED, UNUSED, BYTE = ``<0x00>``..``<0xFF>``), maybe ``merges``, and
``add_space_prefix`` (SentencePiece's ``add_dummy_prefix``).

Follows transformers 5.25 ``integrations/gguf/gguf_tokenizer_mapping.py`` (``sentencepiece_tokenizer``,
``gemma_tokenizer``, ``get_merges``; the model, pre-tokenizer and decoder of
``LlamaTokenizer``/``GemmaTokenizer``):

* BPE with ``byte_fallback`` (a character outside the vocabulary becomes its UTF-8 byte pieces)
  and ``fuse_unk``; merges from the file when it has them, else rebuilt from the vocabulary
  (:func:`derive_merges`, transformers ``generate_merges``): every split of a token into two
  vocabulary entries, best first by the token's score (Llama 2), or by the token's position for
  the Gemma family, whose scores do not follow its merge order.
* Gemma files store whitespace-only tokens with real spaces (``"  "``); they are respelled
  ``"▁▁"`` so the BPE model (which sees ``▁`` for spaces) and the rebuilt merges find them.
* Pre-tokenizer ``Metaspace(split=False)``: spaces -> ``▁``, the whole text one piece (SentencePiece
  does not split on whitespace at encode time); with ``add_space_prefix`` a ``▁`` is prepended to
  the text's first piece unless it starts with a space (``prepend_scheme="first"``, transformers'
  non-legacy Llama). Phi-3 files instead get transformers' ``phi3_tokenizer`` normalizer
  (``Prepend("▁")``, spaces -> ``▁``: a prefix before every piece, also after special tokens).
* Decoder: ``▁`` -> space, byte pieces -> bytes -> UTF-8 (``ByteFallback``; an incomplete character
  decodes to U+FFFD per byte, which the runtime's streaming detokenizer holds back), and with
  ``add_space_prefix`` the one leading space the prefix put there is stripped.

Where we differ from transformers: ``tokenizer.ggml.add_space_prefix`` is obeyed (llama.cpp
``llm_tokenizer_spm`` does; transformers' ``AutoTokenizer(gguf_file=...)`` always prepends for
non-Gemma files and never for Gemma ones). Where we differ from llama.cpp, as transformers does:
llama.cpp also prepends a space to text that follows a special token and always prepends (even to
text that starts with a space), as we do only for Phi-3; llama.cpp matches USER_DEFINED tokens (Gemma's ``"  "``) whole
in the raw text, transformers lets BPE build them from ``▁``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.model.tokenizer.bpe import parse_merges
from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_ADD_SPACE_PREFIX,
    KEY_ARCHITECTURE,
    KEY_MERGES,
    KEY_SCORES,
    KEY_TOKENS,
    GGUFTokenizerError,
    metadata_value,
    require_value,
)

SPACE_PIECE = "\u2581"  # "▁", SentencePiece's spelling of a space
# general.architecture values transformers builds with its own rules (GGUF_SENTENCEPIECE_BUILDERS).
GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
PREFIX_EVERY_PIECE_ARCHITECTURES = frozenset({"phi3"})


@dataclass(frozen=True)
class SentencePieceLayout:
    """How one GGUF SentencePiece vocabulary is turned into a ``tokenizers`` tokenizer.

    ``add_space_prefix``: prepend ``▁`` to the text (and strip that space when decoding);
    ``tokenizer.ggml.add_space_prefix``, defaulting to llama.cpp's true, or false for the Gemma
    family (its SentencePiece model has no dummy prefix; transformers never adds one).
    ``merges_by_position``: rebuilt merges are ranked by the token's position, not its score
    (Gemma). ``respell_space_tokens``: whitespace-only tokens with real spaces become ``▁...``
    (Gemma). ``prefix_every_piece``: the prefix goes before every piece of text, also after a
    special token and before a leading space (Phi-3: transformers' ``phi3_tokenizer`` and the
    legacy Llama ``tokenizer.json``, a ``Prepend`` normalizer; llama.cpp does the same for all)."""

    add_space_prefix: bool
    merges_by_position: bool = False
    respell_space_tokens: bool = False
    prefix_every_piece: bool = False


def sentencepiece_layout(fields: Mapping[str, Any]) -> SentencePieceLayout:
    """The layout of this file: from ``general.architecture`` and ``tokenizer.ggml.add_space_prefix``."""
    architecture = metadata_value(fields, KEY_ARCHITECTURE)
    gemma = architecture in GEMMA_ARCHITECTURES
    add_space_prefix = bool(metadata_value(fields, KEY_ADD_SPACE_PREFIX, not gemma))
    return SentencePieceLayout(
        add_space_prefix,
        merges_by_position=gemma,
        respell_space_tokens=gemma,
        prefix_every_piece=architecture in PREFIX_EVERY_PIECE_ARCHITECTURES,
    )


def sentencepiece_spellings(tokens: Sequence[str], layout: SentencePieceLayout) -> list[str]:
    """Each token as the BPE model stores it: as in the file, except that with
    ``respell_space_tokens`` a token made only of spaces (``"   "``) becomes as many ``▁``."""
    if not layout.respell_space_tokens:
        return list(tokens)
    return [SPACE_PIECE * len(t) if t and not t.strip(" ") else t for t in tokens]


def derive_merges(spellings: Sequence[str], sort_scores: Sequence[float]) -> list[tuple[str, str]]:
    """The merges a vocabulary implies: transformers ``tokenization_utils_base.generate_merges``.

    ``spellings``: the vocabulary, id order, all distinct. ``sort_scores``: one per token, higher
    merges first (a SentencePiece BPE score is minus the merge rank). Every split ``(left, right)``
    of a token into two vocabulary entries is a merge; merges are sorted, stably, best first by
    (the token's score, len(left), len(right)), ties kept in token order. (transformers also sorts
    each token's splits by the ids of ``left`` and ``right`` first; within one token ``len(left)``
    differs between splits, so that order never survives the final sort.) One Python pass over
    the characters of the vocabulary (1.5 M for Gemma 3's 262,144 tokens, 514,906 merges) and
    one NumPy sort.
    """
    import numpy as np

    vocab = set(spellings)
    lefts: list[str] = []
    rights: list[str] = []
    owners: list[int] = []
    for token_id, token in enumerate(spellings):
        for k in range(1, len(token)):
            left = token[:k]
            if left in vocab:
                right = token[k:]
                if right in vocab:
                    lefts.append(left)
                    rights.append(right)
                    owners.append(token_id)
    scores = np.asarray(sort_scores, dtype=np.float64)[np.asarray(owners, dtype=np.int64)]
    len_left = np.fromiter(map(len, lefts), dtype=np.int64, count=len(lefts))
    len_right = np.fromiter(map(len, rights), dtype=np.int64, count=len(rights))
    order = np.lexsort((-len_right, -len_left, -scores))  # stable: ties stay in token order
    return [(lefts[i], rights[i]) for i in order.tolist()]


def _file_merges(fields: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """``tokenizer.ggml.merges`` as pairs, None when the file has none; raises naming a bad entry."""
    merges_raw = metadata_value(fields, KEY_MERGES)
    if not merges_raw:
        return None
    return parse_merges(merges_raw)


def _sort_scores(fields: Mapping[str, Any], num_tokens: int, layout: SentencePieceLayout) -> Sequence[float]:
    """Merge priority per token: minus its position (Gemma) or ``tokenizer.ggml.scores``."""
    if layout.merges_by_position:
        return range(0, -num_tokens, -1)
    scores = list(require_value(fields, KEY_SCORES, "one score per token (the file has no merges either)"))
    if len(scores) != num_tokens:
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_SCORES} has {len(scores)} entries but {KEY_TOKENS} has {num_tokens}; "
            "expected one score per token. Fix: re-convert the model."
        )
    return scores


def sentencepiece_model(
    fields: Mapping[str, Any], spellings: list[str], layout: SentencePieceLayout, unk_token: str | None
) -> Any:
    """``tokenizers.models.BPE`` over the SentencePiece vocabulary: byte fallback, ``fuse_unk``,
    no dropout, merges from the file or :func:`derive_merges`. ``unk_token``: the file's unknown
    token text (used only where a byte piece is missing). Raises :class:`GGUFTokenizerError` for
    repeated spellings, bad merges, or missing/short scores."""
    from tokenizers.models import BPE

    vocab = {spelling: token_id for token_id, spelling in enumerate(spellings)}
    if len(vocab) != len(spellings):
        raise GGUFTokenizerError(
            f"GGUF metadata {KEY_TOKENS} has {len(spellings)} entries but only {len(vocab)} distinct "
            "spellings; expected every token to be unique. Fix: re-convert the model."
        )
    merges = _file_merges(fields)
    if merges is None:
        merges = derive_merges(spellings, _sort_scores(fields, len(spellings), layout))
    return BPE(vocab=vocab, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True, dropout=None)


def _prefix_in_normalizer(layout: SentencePieceLayout) -> bool:
    return layout.add_space_prefix and layout.prefix_every_piece


def sentencepiece_normalizer(layout: SentencePieceLayout) -> Any:
    """None, or for ``prefix_every_piece`` with a space prefix ``Prepend("▁")`` then spaces -> ``▁``
    (transformers ``phi3_tokenizer``)."""
    from tokenizers import normalizers

    if not _prefix_in_normalizer(layout):
        return None
    return normalizers.Sequence([normalizers.Prepend(SPACE_PIECE), normalizers.Replace(" ", SPACE_PIECE)])


def sentencepiece_pre_tokenizer(layout: SentencePieceLayout) -> Any:
    """``Metaspace``: spaces -> ``▁``, no split, ``▁`` prepended to the first piece when the file
    asks for a space prefix (transformers ``LlamaTokenizer``, ``legacy=False``); None when the
    normalizer does it (:func:`sentencepiece_normalizer`)."""
    from tokenizers import pre_tokenizers

    if _prefix_in_normalizer(layout):
        return None
    scheme = "first" if layout.add_space_prefix else "never"
    return pre_tokenizers.Metaspace(replacement=SPACE_PIECE, prepend_scheme=scheme, split=False)


def sentencepiece_decoder(layout: SentencePieceLayout) -> Any:
    """``▁`` -> space, byte pieces -> UTF-8 (U+FFFD per byte of an incomplete character), fuse,
    and strip the one leading space a space prefix added (transformers ``LlamaTokenizer``)."""
    from tokenizers import decoders

    steps = [decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if layout.add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)
