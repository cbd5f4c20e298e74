"""``trtpipe chat``: an interactive multi-turn conversation (llama.cpp's conversation mode).

    stdin line ─► /exit /quit /reset /help, or a user turn
        messages = [system] + kept turns + [user]  ─► chat template ─► token ids
        too long for max_seq_len (prompt + room for the answer)? drop the oldest turns, say so
        ─► LLM.stream (text on stdout as it arrives) ─► the answer becomes an assistant turn

One request at a time on the artifact's runtime; the conversation is re-encoded each turn (the KV
cache is not kept between turns: simple and always consistent with the template). Ctrl-D (end of
input) or /exit ends it; a line that is not UTF-8, a turn that cannot fit, or a turn the engine
failed is reported and the loop goes on (an engine failure makes the exit code 1). Output text
goes to stdout, prompts and notes to stderr, so a piped stdin gives a clean transcript of answers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from trtpipe.pipeline.cli.prompt import decode_utf8
from trtpipe.runtime.errors import RequestError

HELP = "commands: /exit or Ctrl-D ends, /reset forgets the conversation, /help shows this; //text sends /text"


@dataclass
class Conversation:
    """The turns kept for the next prompt (system message first, then user/assistant pairs)."""

    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, user: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns + [{"role": "user", "content": user}]

    def drop_oldest_turn(self) -> bool:
        """Forget the oldest user/assistant pair; False when there is none."""
        if not self.turns:
            return False
        del self.turns[:2]
        return True


def fit_prompt(llm, conv: Conversation, user: str, reserve_tokens: int) -> tuple[list[int], int]:
    """Token ids of the next prompt and how many old turns were dropped so that prompt +
    ``reserve_tokens`` fits in ``max_seq_len``. Raises :class:`RequestError` when even the new
    message alone (with the system message) does not fit."""
    max_len = llm.manifest.limits.max_seq_len
    dropped = 0
    while True:
        ids = llm.encode_chat(conv.messages(user))
        if len(ids) + reserve_tokens <= max_len:
            return ids, dropped
        if not conv.drop_oldest_turn():
            if len(ids) < max_len:  # no history left: answer in the room there is
                return ids, dropped
            raise RequestError(
                f"this message is {len(ids)} tokens with the chat template; max_seq_len is "
                f"{max_len}. Fix: send a shorter message (or /reset)."
            )
        dropped += 1


def run_chat(
    llm,
    params,
    *,
    system: str | None,
    stdin: BinaryIO,
    out: Callable[[str], None],
    note: Callable[[str], None],
    interactive: bool,
) -> int:
    """Run the loop until /exit or end of input; returns the exit code: 0, or 1 when a turn failed
    in the engine (finish reason ``error``: the error is printed, the turn is not kept, the loop goes on).

    ``out`` writes answer text (no newline added), ``note`` one line to stderr. ``interactive``
    shows a ``> `` prompt on stderr before each line.
    """
    conv = Conversation(system=system)
    note(f"chat with {llm.manifest.recipe_name} ({llm.manifest.target.get('name')}); {HELP}")
    failed = False
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        raw = stdin.readline()
        if not raw:  # Ctrl-D / end of piped input
            return 1 if failed else 0
        try:
            line = decode_utf8(raw, "this line").strip()
        except RequestError as e:
            note(f"error: {e}")
            continue
        if line in ("/exit", "/quit"):
            return 1 if failed else 0
        if line == "/reset":
            conv.turns.clear()
            note("conversation reset")
        elif line == "/help":
            note(HELP)
        elif line.startswith("//"):  # "//x" sends "/x" as a message
            failed = not _turn(llm, params, conv, line[1:], out, note) or failed
        elif line.startswith("/") and " " not in line:
            note(f"unknown command {line!r} ({HELP}); to send it as a message, write it as /{line}")
        elif line:
            failed = not _turn(llm, params, conv, line, out, note) or failed


def _turn(llm, params, conv: Conversation, line: str, out: Callable[[str], None], note: Callable[[str], None]) -> bool:
    """One user turn: fit the prompt, stream the answer, keep both in ``conv``. False when the
    engine failed the request (its error is printed and the turn is not kept)."""
    from trtpipe.pipeline.cli.prompt import cap_note

    max_len = llm.manifest.limits.max_seq_len
    try:
        ids, dropped = fit_prompt(llm, conv, line, min(params.max_new_tokens, max_len // 2))
    except RequestError as e:
        note(f"error: {e}")
        return True
    if dropped:
        note(f"note: dropped the {dropped} oldest turn(s) to fit max_seq_len {max_len}")
    capped = cap_note(len(ids), params.max_new_tokens, max_len)
    if capped:
        note(capped)
    for piece in llm.stream(ids, params):
        out(piece)
    answer = llm.last_output
    out("\n")
    m = answer.metrics
    ttft = f"{m.ttft_s * 1e3:.0f} ms" if m.ttft_s is not None else "n/a"
    note(f"[{answer.finish_reason}] {m.output_tokens} tokens, TTFT {ttft}, prompt {len(ids)} tokens")
    if answer.finish_reason == "error":
        note(f"error: {getattr(answer, 'error_message', None) or 'the engine failed this request'}")
        return False
    conv.turns += [{"role": "user", "content": line}, {"role": "assistant", "content": answer.text}]
    return True


__all__ = ["Conversation", "fit_prompt", "run_chat"]
