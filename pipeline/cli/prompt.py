"""Prompt input and sampling flags shared by ``trtpipe generate`` and ``trtpipe chat``.

* :func:`read_prompt`: PROMPT text, ``-`` (stdin) or ``--prompt-file FILE``, strict UTF-8.
* :func:`sampling_params_from_flags`: a validated ``SamplingParams`` whose errors name the CLI
  flags (``--max-new-tokens``), not the Python fields (``SamplingParams.max_new_tokens``).
* :func:`cap_note`: the stderr note when ``--max-new-tokens`` does not fit in ``max_seq_len``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import BinaryIO

from trtpipe.runtime.errors import RequestError

# SamplingParams field -> (CLI flag, an example value for the fix)
FLAG_OF_FIELD = {
    "max_new_tokens": ("--max-new-tokens", "--max-new-tokens 128"),
    "temperature": ("--temperature", "--temperature 0 (greedy) or --temperature 0.7"),
    "top_k": ("--top-k", "--top-k 0 (off) or --top-k 50"),
    "top_p": ("--top-p", "--top-p 1.0 (off) or --top-p 0.9"),
    "seed": ("--seed", "--seed 0"),
    "stop": ("--stop", "--stop '\\n\\n'"),
}
_FIELD_ERROR = re.compile(r"^SamplingParams\.(\w+) = (.*?): expected (.*?); fix: .*$", re.S)


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text; :class:`RequestError` naming ``source`` and the bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            f"{source}: byte {e.start} (0x{data[e.start]:02x}) is not valid UTF-8 "
            f"({e.reason}). Fix: save the prompt as UTF-8 text."
        ) from None


def read_prompt(prompt: str | None, prompt_file: str | None, stdin: BinaryIO | None = None) -> str:
    """The prompt text from exactly one of: PROMPT, ``-`` (read stdin), ``--prompt-file FILE``
    (for the last two, without the final line break).

    Raises :class:`RequestError` (CLI exit 2) for none or both, an unreadable file, or bytes that
    are not UTF-8.
    """
    if prompt_file is not None and prompt is not None:
        raise RequestError(
            f"both PROMPT ({prompt[:20]!r}) and --prompt-file {prompt_file!r} given. Fix: pass one of them."
        )
    if prompt_file is not None:
        try:
            data = Path(prompt_file).read_bytes()
        except OSError as e:
            raise RequestError(
                f"--prompt-file {prompt_file!r}: cannot read it ({e.strerror}). Fix: pass an existing UTF-8 text file."
            ) from None
        return _drop_final_newline(decode_utf8(data, f"--prompt-file {prompt_file!r}"))
    if prompt is None:
        raise RequestError("no prompt. Fix: pass PROMPT, `-` to read it from stdin, or --prompt-file FILE.")
    if prompt == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        return _drop_final_newline(decode_utf8(stream.read(), "the prompt on stdin"))
    return prompt


def _drop_final_newline(text: str) -> str:
    """One final line break goes (``echo`` and editors add it; it would change the prompt's
    tokens and so the answer); any other whitespace is the user's."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def sampling_params_from_flags(**fields):
    """``SamplingParams(**fields).validate()``; its errors are rewritten to name the CLI flags."""
    from trtpipe.runtime.sample.params import SamplingParams

    try:
        return SamplingParams(**fields).validate()
    except RequestError as e:
        m = _FIELD_ERROR.match(str(e))
        if m is None or m.group(1) not in FLAG_OF_FIELD:
            raise
        flag, example = FLAG_OF_FIELD[m.group(1)]
        raise RequestError(f"{flag} {m.group(2)}: expected {m.group(3)}. Fix: pass e.g. {example}.") from None


def cap_note(prompt_tokens: int, max_new_tokens: int, max_seq_len: int) -> str | None:
    """The note printed when prompt + ``--max-new-tokens`` exceeds ``max_seq_len`` (else None)."""
    room = max_seq_len - prompt_tokens
    if max_new_tokens <= room:
        return None
    return (
        f"note: --max-new-tokens {max_new_tokens} capped to {room}: the artifact's max_seq_len is "
        f"{max_seq_len} tokens (prompt + output) and the prompt has {prompt_tokens}."
    )


__all__ = ["FLAG_OF_FIELD", "cap_note", "decode_utf8", "read_prompt", "sampling_params_from_flags"]
