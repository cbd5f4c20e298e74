"""``trtpipe generate`` and ``trtpipe chat``: text from a built artifact (no torch needed).

Prompt input and the sampling flags' validation live in :mod:`trtpipe.pipeline.cli.prompt`, the chat
loop in :mod:`trtpipe.pipeline.cli.chat`.
"""

from __future__ import annotations

import functools
import sys

import click

from trtpipe.pipeline.artifact.locate import resolve_artifact
from trtpipe.pipeline.cli.common import ENGINE_HELP, EXIT_FAILED, EXIT_OK, THREADS_HELP, artifacts_option, fail
from trtpipe.plugins.core.errors import TrtpipeError

GENERATE_SYSTEM_HELP = "System message of the chat template (implies --chat)."
CHAT_SYSTEM_HELP = (
    "System message that opens the conversation (kept when the oldest turns are dropped and after /reset)."
)


def _sampling_options(system_help: str):
    """The sampling flags shared by generate and chat (``--system`` with the command's own help)."""
    return lambda f: _add_sampling_options(f, system_help)


_SAMPLING_FLAGS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")


def _add_sampling_options(f, system_help: str):
    """Add the shared flags to command ``f``; the six sampling ones reach it as one dict,
    ``sampling_flags`` (field name -> value, for :func:`sampling_params_from_flags`)."""

    command = f

    @functools.wraps(command)
    def gather(*args, **kw):
        return command(*args, sampling_flags={k: kw.pop(k) for k in _SAMPLING_FLAGS}, **kw)

    f = gather
    for opt in reversed(
        [
            click.option(
                "--max-new-tokens",
                default=128,
                show_default=True,
                type=int,
                help="Most tokens to generate (capped by the artifact's max_seq_len, with a note).",
            ),
            click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy."),
            click.option("--top-k", default=0, show_default=True, type=int, help="0 = off."),
            click.option("--top-p", default=1.0, show_default=True, type=float, help="1.0 = off."),
            click.option("--seed", default=None, type=int, help="Seed for sampling (reproducible)."),
            click.option("--stop", multiple=True, help="Stop string (repeatable)."),
            click.option("--system", default=None, help=system_help),
            artifacts_option,
            click.option("--threads", default=None, type=click.IntRange(min=1), help=THREADS_HELP),
            click.option(
                "--engine",
                default="auto",
                show_default=True,
                type=click.Choice(["auto", "native", "ort"]),
                help=ENGINE_HELP,
            ),
        ]
    ):
        f = opt(f)
    return f


@click.command("generate")
@click.argument("recipe_or_artifact")
@click.argument("prompt", required=False)
@click.option("--prompt-file", default=None, metavar="FILE", help="Read the prompt from FILE (UTF-8).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@_sampling_options(GENERATE_SYSTEM_HELP)
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it arrives.")
def generate_cmd(
    recipe_or_artifact: str,
    prompt: str | None,
    prompt_file: str | None,
    chat: bool,
    sampling_flags: dict,
    system: str | None,
    artifact_root: str,
    threads: int | None,
    engine: str,
    stream: bool,
) -> None:
    """Generate text for PROMPT with a built artifact (no torch, no model package needed).

    \b
    RECIPE_OR_ARTIFACT: a recipe (its artifact must be built from it) or an artifact directory.
    PROMPT: the text; `-` reads it from stdin; or use --prompt-file FILE (UTF-8; one final
    line break is dropped).
    Text goes to stdout; the request's TTFT and TPOT (and notes) to stderr.
    Exit codes: 0 done, 1 the request failed in the engine, 2 usage or artifact error.
    Example: trtpipe generate smollm2-135m-cpu "What is the capital of France?" --chat
             echo "Why is the sky blue?" | trtpipe generate smollm2-135m-cpu - --chat
    """
    from trtpipe.pipeline.cli.prompt import cap_note, read_prompt, sampling_params_from_flags
    from trtpipe.runtime.llm import LLM

    try:
        text = read_prompt(prompt, prompt_file)
        params = sampling_params_from_flags(**sampling_flags)
        art = resolve_artifact(recipe_or_artifact, artifact_root)
        llm = LLM(art, num_threads=threads, engine=engine)
        if system is not None:
            ids = llm.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": text}])
        else:
            ids = llm.encode_prompt(text, chat=chat)
        note = cap_note(len(ids), sampling_flags["max_new_tokens"], llm.manifest.limits.max_seq_len)
        if note:
            click.echo(click.style(note, fg="yellow"), err=True)
        if stream:
            for piece in llm.stream(ids, params):
                click.echo(piece, nl=False)
            out = llm.last_output
            click.echo()
        else:
            out = llm.generate([ids], params)[0]
            click.echo(out.text)
    except TrtpipeError as e:
        fail(e)
    click.echo(click.style(_request_stats(llm, out), dim=True), err=True)
    if not chat and system is None and out.finish_reason == "stop" and not out.text.strip():
        click.echo(
            "note: the model ended at once on the raw prompt; an instruct (chat) model answers a "
            "question wrapped in its chat template. Fix: add --chat",
            err=True,
        )
    if out.finish_reason == "error":
        click.echo(f"error: {out.error_message}", err=True)
        sys.exit(EXIT_FAILED)


def _request_stats(llm, out) -> str:
    """``[stop] 24 tokens, TTFT 80.1 ms, TPOT 11.2 ms`` plus the achieved decode tokens/s and read
    bandwidth (and its share of a GPU target's, from the target table)."""
    from trtpipe.runtime.metrics.decode_bandwidth import request_decode_note

    m = out.metrics
    tpot = f"{m.tpot_s * 1e3:.1f} ms" if m.tpot_s is not None else "n/a (1 token)"
    ttft = f"{m.ttft_s * 1e3:.1f} ms" if m.ttft_s is not None else "n/a"
    target = llm.manifest.target.get("name")
    peak = None if target in (None, "cpu") else _target_bandwidth(target)
    bw = request_decode_note(llm.manifest, m.prompt_tokens, m.output_tokens, m.tpot_s, peak, llm.capabilities.backend)
    return f"[{out.finish_reason}] {m.output_tokens} tokens, TTFT {ttft}, TPOT {tpot}{bw}"


def _target_bandwidth(name: str) -> float | None:
    """The target table's read bandwidth of a GPU target (bytes/s); None for an unknown name."""
    from trtpipe.pipeline.targets import get_target

    try:
        return get_target(name).bandwidth_bytes_per_s
    except TrtpipeError:
        return None


@click.command("chat")
@click.argument("recipe_or_artifact")
@_sampling_options(CHAT_SYSTEM_HELP)
def chat_cmd(
    recipe_or_artifact: str,
    sampling_flags: dict,
    system: str | None,
    artifact_root: str,
    threads: int | None,
    engine: str,
) -> None:
    """Talk with a built artifact, turn by turn (the chat template, streamed answers).

    \b
    Type a message and Enter; the answer streams on stdout. The conversation is kept for the
    next turn; when it no longer fits in max_seq_len, the oldest turns are dropped (with a note).
    Commands: /exit (or Ctrl-D) ends, /reset forgets the conversation, /help.
    Piped input works: one message per line.
    Exit codes: 0 ended (/exit or end of input); 1 a turn failed in the engine (the error is
    printed, that turn is not kept and the chat goes on); 2 usage or artifact error.
    Example: trtpipe chat smollm2-135m-cpu --system "You are a terse assistant."
    """
    from trtpipe.pipeline.cli.chat import run_chat
    from trtpipe.pipeline.cli.prompt import sampling_params_from_flags
    from trtpipe.runtime.llm import LLM

    try:
        params = sampling_params_from_flags(**sampling_flags)
        llm = LLM(resolve_artifact(recipe_or_artifact, artifact_root), num_threads=threads, engine=engine)
        if not llm.manifest.model.chat_template:
            raise TrtpipeError(
                "this model has no chat template in its metadata, so it cannot chat. "
                "Fix: use `trtpipe generate` with a plain prompt."
            )

        def out(piece: str) -> None:
            click.echo(piece, nl=False)
            sys.stdout.flush()

        def note(line: str) -> None:
            click.echo(click.style(line, dim=True), err=True)

        code = run_chat(
            llm, params, system=system, stdin=sys.stdin.buffer, out=out, note=note, interactive=sys.stdin.isatty()
        )
    except TrtpipeError as e:
        fail(e)
    except KeyboardInterrupt:
        click.echo("", err=True)
        code = EXIT_OK
    sys.exit(code)
