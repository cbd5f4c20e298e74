"""Special and added tokens of a GGUF tokenizer, and the post-processor that inserts BOS/EOS.

Follows transformers ``add_gguf_special_tokens`` (CONTROL (3) tokens added as special tokens,
USER_DEFINED (4) tokens as plain added tokens; for SentencePiece files also the BOS/EOS/UNK/PAD
tokens, which ``TokenizersBackend`` adds from the special-token names) and
``convert_slow_tokenizer.GPT2Converter`` / ``LlamaTokenizer`` (BOS added by the post-processor only
when ``add_bos_token``; otherwise a no-op).
"""

from __future__ import annotations

from typing import Any

from trtpipe.pipeline.model.tokenizer.fields import (
    KEY_ADD_BOS,
    KEY_ADD_EOS,
    KEY_TOKENS,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_USER_DEFINED,
    GGUFTokenizerError,
)


def add_gguf_added_tokens(
    tok: Any,
    tokens: list[str],
    token_types: list[int],
    *,
    spellings: list[str] | None = None,
    special_ids: tuple[int, ...] = (),
) -> None:
    """Add CONTROL tokens (and the tokens at ``special_ids``: BOS/EOS/UNK/PAD of a SentencePiece
    file, which transformers adds as special whatever their type) as special tokens (matched whole
    in text, dropped by ``decode(skip_special_tokens=True)``) and USER_DEFINED tokens as
    non-special added tokens to ``tok`` (a ``tokenizers.Tokenizer`` whose model vocabulary already
    holds every token).

    ``spellings``: the model's spelling of each token when it differs from the file's (Gemma's
    ``"  "`` is ``"▁▁"``); a token respelled there is left to the model, not added (transformers
    does the same: adding it would give it a new id).

    Raises :class:`GGUFTokenizerError` if that grew the id count past ``len(tokens)`` (an added
    token missing from the model vocabulary would get a new id past the embedding table)."""
    from tokenizers import AddedToken

    kept = range(len(tokens)) if spellings is None else [i for i, t in enumerate(tokens) if spellings[i] == t]
    special_set = set(special_ids)
    control = [
        AddedToken(tokens[i], normalized=False, special=True)
        for i in kept
        if token_types[i] == TOKEN_TYPE_CONTROL or i in special_set
    ]
    user_defined = [
        AddedToken(tokens[i], normalized=False, special=False)
        for i in kept
        if token_types[i] == TOKEN_TYPE_USER_DEFINED and i not in special_set
    ]
    if control:
        tok.add_special_tokens(control)
    if user_defined:
        tok.add_tokens(user_defined)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFTokenizerError(
            f"building the tokenizer from {KEY_TOKENS} ({len(tokens)} tokens) produced "
            f"{tok.get_vocab_size(with_added_tokens=True)} ids; expected {len(tokens)}. "
            "This is a trtpipe bug; please report it with the GGUF's tokenizer metadata."
        )


def post_processor(meta: dict[str, Any], *, byte_level: bool = True) -> Any:
    """BOS/EOS template when the file asks for them (the id must exist), else a no-op: the
    ``ByteLevel(trim_offsets=False)`` that transformers' GPT2Converter uses (``byte_level``), or
    a template of the sequence alone (SentencePiece).

    ``meta``: :func:`~trtpipe.pipeline.model.tokenizer.metadata.gguf_tokenizer_metadata`.
    Pairs follow Hugging Face's Llama convention: ``BOS A EOS BOS B EOS`` (each part optional).
    Raises :class:`GGUFTokenizerError` when ``add_bos_token``/``add_eos_token`` is true but the id
    is missing or outside the vocabulary.
    """
    from tokenizers import processors

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
    if not special and byte_level:
        return processors.ByteLevel(trim_offsets=False)

    def part(seq: str, type_id: int) -> list[str]:
        bos = [f"{ends['bos']}:{type_id}"] if "bos" in ends else []
        eos = [f"{ends['eos']}:{type_id}"] if "eos" in ends else []
        return [*bos, f"${seq}:{type_id}", *eos]

    return processors.TemplateProcessing(single=part("A", 0), pair=part("A", 0) + part("B", 1), special_tokens=special)
