"""``trtpipe chat``: the turn loop with a fake runtime (trimming, commands, bad lines), then piped
stdin through the real artifact (multi-turn history, /reset, /exit)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tests.conftest import FRANCE_PROMPT
from tests.reference_outputs import assert_text_follows_reference
from trtpipe.pipeline.cli.chat import Conversation, fit_prompt, run_chat
from trtpipe.pipeline.cli.main import main
from trtpipe.runtime.sample.params import SamplingParams


class FakeLLM:
    """One token per character of every message's content; answers "ok" + the turn number."""

    def __init__(self, max_seq_len: int):
        self.manifest = SimpleNamespace(
            limits=SimpleNamespace(max_seq_len=max_seq_len), recipe_name="fake", target={"name": "cpu"}
        )
        self.prompts: list[list[dict]] = []
        self.turns = 0

    def encode_chat(self, messages):
        self.prompts.append([dict(m) for m in messages])
        return [0] * sum(len(m["content"]) for m in messages)

    def stream(self, ids, params):
        self.turns += 1
        text = f"ok{self.turns}"
        self.last_output = SimpleNamespace(
            text=text, finish_reason="stop", metrics=SimpleNamespace(ttft_s=0.01, output_tokens=1)
        )
        yield text


def chat(llm, lines: str, system=None, max_new_tokens=10):
    out, notes = [], []
    code = run_chat(
        llm,
        SamplingParams(max_new_tokens=max_new_tokens),
        system=system,
        stdin=io.BytesIO(lines.encode() if isinstance(lines, str) else lines),
        out=out.append,
        note=notes.append,
        interactive=False,
    )
    return code, "".join(out), notes


def test_fit_prompt_drops_the_oldest_turns_first():
    conv = Conversation(
        system="S" * 10,
        turns=[
            {"role": "user", "content": "a" * 30},
            {"role": "assistant", "content": "b" * 30},
            {"role": "user", "content": "c" * 20},
            {"role": "assistant", "content": "d" * 20},
        ],
    )
    llm = FakeLLM(max_seq_len=100)
    ids, dropped = fit_prompt(llm, conv, "q" * 15, reserve_tokens=10)
    # 10 + 60 + 40 + 15 = 125 > 90 -> drop the first pair: 10 + 40 + 15 = 65 <= 90
    assert dropped == 1 and len(ids) == 65
    assert [m["content"][0] for m in conv.messages("q")] == ["S", "c", "d", "q"]
    # only the system message and the new one, still too long with the reserve: answer in the room left
    ids, dropped = fit_prompt(llm, conv, "q" * 85, reserve_tokens=10)
    assert dropped == 1 and len(ids) == 95 and conv.turns == []
    with pytest.raises(Exception, match="this message is 100 tokens.*max_seq_len is 100"):
        fit_prompt(llm, conv, "q" * 90, reserve_tokens=10)


def test_loop_keeps_history_trims_with_a_note_and_handles_commands():
    llm = FakeLLM(max_seq_len=40)
    code, out, notes = chat(llm, "x" * 10 + "\n\n/help\n" + "y" * 10 + "\n" + "z" * 10 + "\n/reset\nw\n/exit\nnever\n")
    assert code == 0
    assert out == "ok1\nok2\nok3\nok4\n"
    # turn 2 sees turn 1; turn 3 (10 + 3 + 10 + 3 + 10 = 36 > 40 - 10) drops turn 1 with a note
    assert [m["content"] for m in llm.prompts[1]] == ["x" * 10, "ok1", "y" * 10]
    assert [m["content"] for m in llm.prompts[-2]] == ["y" * 10, "ok2", "z" * 10]
    assert "note: dropped the 1 oldest turn(s) to fit max_seq_len 40" in notes
    assert "conversation reset" in notes and [m["content"] for m in llm.prompts[-1]] == ["w"]
    assert any(n.startswith("commands:") for n in notes[1:])  # /help


def test_loop_reports_a_bad_line_and_goes_on_and_ends_at_eof():
    llm = FakeLLM(max_seq_len=100)
    code, out, notes = chat(llm, b"caf\xe9\nhello\n")  # no /exit: end of input ends it
    assert code == 0 and out == "ok1\n"
    assert any("byte 3 (0xe9) is not valid UTF-8" in n for n in notes)
    code, out, notes = chat(FakeLLM(max_seq_len=20), "q" * 30 + "\nhi\n", system="S")
    assert out == "ok1\n" and any("this message is 31 tokens" in n for n in notes)


@pytest.mark.slow
def test_chat_through_the_real_artifact(default_artifact):
    """Piped stdin: the first answer is generate's; the second turn's prompt carries the first
    (more prompt tokens); after /reset the same question gets the same greedy answer."""
    gen = CliRunner().invoke(
        main, ["generate", str(default_artifact), FRANCE_PROMPT, "--chat", "--max-new-tokens", "24"]
    )
    res = CliRunner().invoke(
        main,
        ["chat", str(default_artifact), "--max-new-tokens", "24"],
        input=f"{FRANCE_PROMPT}\nAnd of Italy?\n/reset\n{FRANCE_PROMPT}\n/exit\n",
    )
    assert res.exit_code == 0, res.output
    answers = res.stdout.splitlines()
    assert len(answers) == 3
    assert answers[0] == answers[2] == gen.stdout.strip()
    assert_text_follows_reference(answers[0], default_artifact, FRANCE_PROMPT, max_tokens=24)
    stats = [ln for ln in res.stderr.splitlines() if ln.startswith("[")]
    prompt_tokens = [int(ln.split("prompt ")[1].split()[0]) for ln in stats]
    assert prompt_tokens[0] == prompt_tokens[2] == 37 and prompt_tokens[1] > 37 + 5
    assert "conversation reset" in res.stderr


class FailingLLM(FakeLLM):
    """Like FakeLLM, but the engine fails the turns whose message starts with "boom"."""

    def stream(self, ids, params):
        if self.prompts[-1][-1]["content"].startswith("boom"):
            self.last_output = SimpleNamespace(
                text="",
                finish_reason="error",
                error_message="engine exploded",
                metrics=SimpleNamespace(ttft_s=None, output_tokens=0),
            )
            return
        yield from super().stream(ids, params)


def test_loop_engine_error_is_reported_not_kept_and_exits_1():
    llm = FailingLLM(max_seq_len=100)
    code, out, notes = chat(llm, "hi\nboom\nagain\n")
    assert code == 1  # an engine failure is not a clean end
    assert "error: engine exploded" in notes
    assert out == "ok1\n\nok2\n"  # the loop went on after the failed turn
    assert [m["content"] for m in llm.prompts[-1]] == ["hi", "ok1", "again"]  # the failed turn was not kept
    assert chat(FailingLLM(max_seq_len=100), "hi\n/exit\n")[0] == 0
    assert chat(FailingLLM(max_seq_len=100), "boom\n/exit\n")[0] == 1


def test_chat_command_exits_nonzero_on_an_engine_error(monkeypatch):
    """`trtpipe chat` (the command, not just the loop) exits 1 when the engine failed a turn."""
    import trtpipe.pipeline.cli.generate as cli_generate
    import trtpipe.runtime.llm as runtime_llm

    def fake_llm(path, num_threads=None, engine="auto"):
        llm = FailingLLM(max_seq_len=100)
        llm.manifest.model = SimpleNamespace(chat_template="{{ messages }}")
        return llm

    monkeypatch.setattr(cli_generate, "resolve_artifact", lambda name, root: name)
    monkeypatch.setattr(runtime_llm, "LLM", fake_llm)
    res = CliRunner().invoke(main, ["chat", "fake-artifact"], input="boom\n")
    assert res.exit_code == 1, res.output
    assert "engine exploded" in res.stderr
    res = CliRunner().invoke(main, ["chat", "fake-artifact"], input="hello\n")
    assert res.exit_code == 0 and res.stdout == "ok1\n", res.output


def test_help_texts_of_system_and_api_key():
    """chat's --system is described as the conversation's system message (generate's implies --chat);
    validate --api-key names TRTPIPE_API_KEY."""

    def help_of(cmd: str) -> str:  # one line: the terminal width wraps the help anywhere
        return " ".join(CliRunner().invoke(main, [cmd, "--help"]).output.split())

    chat_help, gen_help, val_help = help_of("chat"), help_of("generate"), help_of("validate")
    assert "opens the conversation" in chat_help and "implies --chat" not in chat_help
    assert "implies --chat" in gen_help
    assert "TRTPIPE_API_KEY" in val_help.split("--api-key", 1)[1].split("--goodput", 1)[0]
    assert "1 a turn failed in the engine" in chat_help


def test_an_unknown_command_is_reported_not_sent_and_a_double_slash_sends_it():
    llm = FakeLLM(max_seq_len=100)
    code, out, notes = chat(llm, "/bogus\n//bogus\n/exit\n")
    assert code == 0 and out == "ok1\n"
    assert any(n.startswith("unknown command '/bogus'") and "//bogus" in n for n in notes)
    assert [m["content"] for m in llm.prompts[0]] == ["/bogus"]  # only the // line reached the model
