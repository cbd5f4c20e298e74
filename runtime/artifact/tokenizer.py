"""Text <-> token ids on the deploy side: a thin wrapper around a ``tokenizers`` tokenizer.json.

No torch, no transformers: the artifact carries a ``tokenizer.json`` (written by the pipeline,
e.g. from GGUF metadata by ``trtpipe.pipeline.model.tokenizer``) and the BOS/EOS ids in its
manifest, because a tokenizer.json does not record which tokens those are.

Special tokens written in the text (``<|im_start|>``) are always matched as one token, as
transformers does: that is what a rendered chat template needs. Escape untrusted user text
before templating if it must not be able to inject control tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer as _BackendTokenizer

from trtpipe.runtime.errors import ArtifactError, RequestError


class Tokenizer:
    """Encode text to token ids and decode ids back to text.

    ``backend``: a ``tokenizers.Tokenizer``. ``bos_token_id`` / ``eos_token_id``: from the
    manifest (None when the model has none). Ids are Python ints in ``[0, vocab_size)``.
    """

    def __init__(
        self, backend: _BackendTokenizer, *, bos_token_id: int | None = None, eos_token_id: int | None = None
    ) -> None:
        self._backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        for name, token_id in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if token_id is not None and not 0 <= token_id < self.vocab_size:
                raise ArtifactError(
                    f"{name} = {token_id} is outside the tokenizer's vocabulary [0, {self.vocab_size}); "
                    "expected an id of the same tokenizer. Fix: rebuild the artifact."
                )
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self._spelling: str | None = None  # how the vocabulary spells bytes (_spelling_kind; found on first use)
        self._added: set[str] = set()

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, bos_token_id: int | None = None, eos_token_id: int | None = None
    ) -> Tokenizer:
        """Load a ``tokenizer.json``. Raises :class:`ArtifactError` naming the file when it is
        missing or not a tokenizers serialization."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ArtifactError(
                f"tokenizer file {path!r} does not exist; expected the artifact's tokenizer.json. "
                "Fix: rebuild the artifact (trtpipe build) or point to the right artifact directory."
            )
        try:
            backend = _BackendTokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ArtifactError(
                f"tokenizer file {path!r} is not a valid tokenizers JSON ({exc}). "
                "Fix: rebuild the artifact; the file may be truncated or written by another tool."
            ) from exc
        return cls(backend, bos_token_id=bos_token_id, eos_token_id=eos_token_id)

    @property
    def backend(self) -> _BackendTokenizer:
        """The underlying ``tokenizers.Tokenizer`` (for batch encoding, offsets, ...)."""
        return self._backend

    def encode(self, text: str | bytes, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``bytes`` are decoded as strict UTF-8; invalid bytes (and, in a ``str``, lone surrogates
        that UTF-8 cannot carry) raise :class:`RequestError` naming the offset.
        ``add_special_tokens`` lets the post-processor add what the model asks for (BOS for
        Llama 3; nothing for SmolLM2); pass False for an already templated prompt that has it.
        """
        if isinstance(text, (bytes, bytearray, memoryview)):
            raw = bytes(text)
            try:
                text = raw.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.end]
                raise RequestError(
                    f"prompt: invalid UTF-8 at byte offset {exc.start} ({bad.hex(' ')}: {exc.reason}); "
                    "expected UTF-8 encoded text. Fix: send the prompt as UTF-8 (re-encode it from "
                    "its real encoding, e.g. bytes.decode('latin-1').encode('utf-8'))."
                ) from None
        elif isinstance(text, str):
            try:
                text.encode("utf-8", errors="strict")
            except UnicodeEncodeError as exc:
                raise RequestError(
                    f"prompt: character offset {exc.start} is {text[exc.start]!r} ({exc.reason}), "
                    "which UTF-8 cannot encode; expected valid Unicode text. Fix: decode the input "
                    "bytes with errors='strict' (not 'surrogateescape') or send it as UTF-8 bytes."
                ) from None
        else:
            raise RequestError(f"prompt: got {type(text).__name__}; expected str or UTF-8 bytes.")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Byte-level tokens that end inside a UTF-8 character decode to U+FFFD;
        decode a whole sequence (or use an incremental detokenizer) for streaming."""
        id_list = [int(i) for i in ids]
        for position, token_id in enumerate(id_list):
            if not 0 <= token_id < self.vocab_size:
                raise RequestError(
                    f"ids[{position}] = {token_id} is outside the vocabulary [0, {self.vocab_size}); "
                    "expected ids produced by this model's tokenizer."
                )
        return self._backend.decode(id_list, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token as the vocabulary spells it (``"<|im_end|>"``, ``"Ġthe"``), or None."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary spelling of an id, or None."""
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (OpenAI's logprobs ``bytes``): byte-level BPE
        spellings mapped back through GPT-2's byte alphabet; SentencePiece spellings with ``▁``
        as a space and byte pieces ``<0xNN>`` as the byte NN (tokenizers' ``Replace`` +
        ``ByteFallback`` decoder); added/special tokens as their UTF-8 text. A token inside a
        multi-byte character has only part of it."""
        spelling = self._backend.id_to_token(int(token_id)) or ""
        if self._spelling is None:
            self._spelling = _spelling_kind(self._backend)
            self._added = {t.content for t in self._backend.get_added_tokens_decoder().values()}
        if spelling in self._added:
            return spelling.encode("utf-8")
        if self._spelling == "sentencepiece":
            if len(spelling) == 6 and spelling.startswith("<0x") and spelling.endswith(">"):
                try:
                    return bytes([int(spelling[3:5], 16)])
                except ValueError:
                    pass
            return spelling.replace(SENTENCEPIECE_SPACE, " ").encode("utf-8")
        table = _byte_decoder()
        if self._spelling == "byte_level" and all(c in table for c in spelling):
            return bytes(table[c] for c in spelling)
        return spelling.encode("utf-8")


SENTENCEPIECE_SPACE = "\u2581"  # '▁', SentencePiece's spelling of a space


def _spelling_kind(backend: _BackendTokenizer) -> str:
    """How the vocabulary spells bytes: ``"byte_level"`` (GPT-2 byte alphabet: a ``ByteLevel``
    decoder), ``"sentencepiece"`` (a decoder with ``ByteFallback`` or one replacing ``▁``) or
    ``"plain"`` (spellings are the UTF-8 text)."""
    import json

    decoder = json.loads(backend.to_str()).get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    kinds = {step.get("type") for step in steps if isinstance(step, dict)}
    if "ByteLevel" in kinds:
        return "byte_level"
    replaces_space = any(
        step.get("type") == "Replace" and SENTENCEPIECE_SPACE in json.dumps(step.get("pattern"), ensure_ascii=False)
        for step in steps
        if isinstance(step, dict)
    )
    if "ByteFallback" in kinds or "Metaspace" in kinds or replaces_space:
        return "sentencepiece"
    return "plain"


_BYTE_DECODER: dict[str, int] = {}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character -> byte table (``bytes_to_unicode`` inverted)."""
    if not _BYTE_DECODER:
        keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        chars, extra = list(keep), 0
        for b in range(256):
            if b not in keep:
                keep.append(b)
                chars.append(256 + extra)
                extra += 1
        _BYTE_DECODER.update({chr(c): b for b, c in zip(keep, chars)})
    return _BYTE_DECODER
