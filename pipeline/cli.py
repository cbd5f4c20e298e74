"""The ``trtpipe`` command line (click). Heavy imports happen inside each command, so
``trtpipe --help`` and ``trtpipe generate`` work without torch installed.

Exit codes (``trtpipe --help`` and the README list them): 0 built / passed; 1 a validate budget
or correctness check failed; 2 usage, recipe or artifact errors (click's own usage errors are 2
as well); 3 a GPU-target build wrote its build spec and must be finished on the target
(``trtpipe build --from-spec``).

Helpers live beside this module (``cli_artifact``: artifacts root and recipe -> artifact;
``cli_prompt``: prompt input and sampling flags; ``cli_chat``: the chat loop); the commands all
live here, and other modules add theirs with ``main.add_command``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from trtpipe.pipeline.cli_artifact import artifacts_option, resolve_artifact
from trtpipe.plugins.errors import TrtpipeError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NEEDS_TARGET = 0, 1, 2, 3
THREADS_HELP = ("ONNX Runtime intra-op threads (default: the recipe's engine.intra_op_num_threads, "
                "else ONNX Runtime's).")

def _fail(e: Exception, code: int = EXIT_USAGE) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + str(e), err=True)
    sys.exit(code)


def _load_recipe(recipe: str):
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    return load_recipe(resolve_recipe_path(recipe))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option("0.1.0", prog_name="trtpipe")
def main() -> None:
    """trtpipe: ship a decoder-only LLM with measured, enforced latency.

    \b
    A recipe (YAML) names the model, the target (cpu | orin | a100 | h200), the precision of
    each phase, the paged KV cache, the limits and the latency budgets. Typical use:
      trtpipe build smollm2-135m-cpu          # export + lower + write artifacts/<recipe>/<target>
      trtpipe generate smollm2-135m-cpu "What is the capital of France?" --chat --stream
      trtpipe validate smollm2-135m-cpu       # TTFT/TPOT/ITL vs budgets; exit 1 if any fails
      trtpipe estimate recipes/llama2-7b-orin.yaml   # memory and latency before a build

    RECIPE is a path to a YAML file or the name of a shipped recipe (see `trtpipe recipes`).
    Artifacts live under --artifacts, else $TRTPIPE_ARTIFACTS, else ./artifacts.

    \b
    Exit codes:
      0  built / passed
      1  a budget or correctness check failed (validate)
      2  usage, recipe or artifact error
      3  GPU target: build spec written, finish on the target (trtpipe build --from-spec)
    """


@main.command("recipes")
def recipes_cmd() -> None:
    """List the shipped recipes: name (pass it as RECIPE), target and description."""
    from rich.console import Console
    from rich.table import Table

    from trtpipe.pipeline.recipe import RECIPES_DIR, load_recipe, shipped_recipe_names

    table = Table(title=f"shipped recipes ({RECIPES_DIR})", title_justify="left")
    for col in ("name", "target", "description"):
        table.add_column(col, overflow="fold")
    for n in shipped_recipe_names():
        try:
            r = load_recipe(RECIPES_DIR / f"{n}.yaml", check_files=False)
            table.add_row(n, r.target, r.description or "")
        except TrtpipeError as e:
            table.add_row(n, "?", f"(does not load: {str(e).splitlines()[0]})")
    Console(highlight=False, soft_wrap=False).print(table)


@main.command("build")
@click.argument("recipe")
@artifacts_option
@click.option("--force", is_flag=True, help="Rebuild even if the inputs (recipe, model, versions) are unchanged; "
              "the previous artifact's validate reports are kept under validate/previous-<build hash>/.")
@click.option("--from-spec", "from_spec", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Finish a GPU build on the target machine from the build_spec.json a CPU machine wrote.")
def build_cmd(recipe: str, artifact_root: str, force: bool, from_spec: str | None) -> None:
    """Build the artifact for RECIPE: load the model, export the prefill and decode ONNX graphs,
    lower them for the target's backend (ONNX Runtime for cpu, TensorRT plans for GPUs), record
    golden outputs and write manifest.json.

    \b
    Output: artifacts/<recipe>/<target>/ (manifest.json, prefill.onnx, decode.onnx, weights.data,
    tokenizer.json, golden.json). Writes are atomic: a failed build keeps the previous artifact.
    GPU targets (orin, a100, h200) on a machine without that GPU and TensorRT: the graphs and
    build_spec.json are written and the build exits 3; finish with --from-spec on the target.
    Exit codes: 0 built (or up to date), 2 error, 3 build spec written, finish on the target.
    Example: trtpipe build smollm2-135m-cpu
    """
    from trtpipe.pipeline.build_trt import BuildNeedsTarget

    try:
        if from_spec:
            from trtpipe.pipeline.build_trt import build_from_spec

            build_from_spec(Path(from_spec), log=click.echo)
            return
        import signal

        from rich.console import Console

        from trtpipe.pipeline.build import build

        # SIGTERM (timeout, CI cancel) unwinds like Ctrl-C, so the build removes its temp folder
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

        r = _load_recipe(recipe)
        console = Console(stderr=True)
        with console.status(f"building {r.name} for {r.target} ...") as status:
            def log(msg: str) -> None:  # a spinner on the long steps, a timestamped line per step
                console.log(msg)
                status.update(msg)

            res = build(r, artifact_root, force=force, log=log)
        if not res.skipped:
            click.echo(f"built {res.artifact_dir} in {res.seconds:.1f} s")
    except BuildNeedsTarget as e:
        click.echo(click.style("build spec written, finish on the target: ", fg="yellow", bold=True) + str(e),
                   err=True)
        sys.exit(EXIT_NEEDS_TARGET)
    except TrtpipeError as e:
        _fail(e)


def _sampling_options(f):
    """The sampling flags shared by generate and chat."""
    for opt in reversed([
        click.option("--max-new-tokens", default=128, show_default=True, type=int,
                     help="Most tokens to generate (capped by the artifact's max_seq_len, with a note)."),
        click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy."),
        click.option("--top-k", default=0, show_default=True, type=int, help="0 = off."),
        click.option("--top-p", default=1.0, show_default=True, type=float, help="1.0 = off."),
        click.option("--seed", default=None, type=int, help="Seed for sampling (reproducible)."),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option("--system", default=None, help="System message of the chat template (implies --chat)."),
        artifacts_option,
        click.option("--threads", default=None, type=click.IntRange(min=1),
                     help=THREADS_HELP),
    ]):
        f = opt(f)
    return f


@main.command("generate")
@click.argument("recipe_or_artifact")
@click.argument("prompt", required=False)
@click.option("--prompt-file", default=None, metavar="FILE", help="Read the prompt from FILE (UTF-8).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@_sampling_options
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it arrives.")
def generate_cmd(recipe_or_artifact: str, prompt: str | None, prompt_file: str | None, chat: bool,
                 max_new_tokens: int, temperature: float, top_k: int, top_p: float, seed: int | None,
                 stop: tuple[str, ...], system: str | None, artifact_root: str, threads: int | None,
                 stream: bool) -> None:
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
    from trtpipe.pipeline.cli_prompt import cap_note, read_prompt, sampling_params_from_flags
    from trtpipe.runtime.llm import LLM

    try:
        text = read_prompt(prompt, prompt_file)
        params = sampling_params_from_flags(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                            top_p=top_p, seed=seed, stop=stop)
        art = resolve_artifact(recipe_or_artifact, artifact_root)
        llm = LLM(art, num_threads=threads)
        if system is not None:
            ids = llm.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": text}])
        else:
            ids = llm.encode_prompt(text, chat=chat)
        note = cap_note(len(ids), max_new_tokens, llm.manifest.limits["max_seq_len"])
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
        _fail(e)
    m = out.metrics
    tpot = f"{m.tpot_s * 1e3:.1f} ms" if m.tpot_s is not None else "n/a (1 token)"
    ttft = f"{m.ttft_s * 1e3:.1f} ms" if m.ttft_s is not None else "n/a"
    from trtpipe.runtime.decode_bandwidth import request_decode_note

    peak = None if llm.manifest.target.get("name") in (None, "cpu") else _target_bandwidth(llm.manifest.target["name"])
    bw = request_decode_note(llm.manifest, m.prompt_tokens, m.output_tokens, m.tpot_s, peak)
    click.echo(click.style(f"[{out.finish_reason}] {m.output_tokens} tokens, TTFT {ttft}, TPOT {tpot}{bw}", dim=True),
               err=True)
    if out.finish_reason == "error":
        click.echo(f"error: {out.error_message}", err=True)
        sys.exit(EXIT_FAILED)


def _target_bandwidth(name: str) -> float | None:
    """The target table's read bandwidth of a GPU target (bytes/s); None for an unknown name."""
    from trtpipe.pipeline.targets import get_target

    try:
        return get_target(name).bandwidth_bytes_per_s
    except TrtpipeError:
        return None


@main.command("chat")
@click.argument("recipe_or_artifact")
@_sampling_options
def chat_cmd(recipe_or_artifact: str, max_new_tokens: int, temperature: float, top_k: int, top_p: float,
             seed: int | None, stop: tuple[str, ...], system: str | None, artifact_root: str,
             threads: int | None) -> None:
    """Talk with a built artifact, turn by turn (the chat template, streamed answers).

    \b
    Type a message and Enter; the answer streams on stdout. The conversation is kept for the
    next turn; when it no longer fits in max_seq_len, the oldest turns are dropped (with a note).
    Commands: /exit (or Ctrl-D) ends, /reset forgets the conversation, /help.
    Piped input works: one message per line.
    Example: trtpipe chat smollm2-135m-cpu --system "You are a terse assistant."
    """
    from trtpipe.pipeline.cli_chat import run_chat
    from trtpipe.pipeline.cli_prompt import sampling_params_from_flags
    from trtpipe.runtime.llm import LLM

    try:
        params = sampling_params_from_flags(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                            top_p=top_p, seed=seed, stop=stop)
        llm = LLM(resolve_artifact(recipe_or_artifact, artifact_root), num_threads=threads)
        if not llm.manifest.model.chat_template:
            raise TrtpipeError("this model has no chat template in its metadata, so it cannot chat. "
                               "Fix: use `trtpipe generate` with a plain prompt.")

        def out(piece: str) -> None:
            click.echo(piece, nl=False)
            sys.stdout.flush()

        def note(line: str) -> None:
            click.echo(click.style(line, dim=True), err=True)

        code = run_chat(llm, params, system=system, stdin=sys.stdin.buffer, out=out, note=note,
                        interactive=sys.stdin.isatty())
    except TrtpipeError as e:
        _fail(e)
    except KeyboardInterrupt:
        click.echo("", err=True)
        code = EXIT_OK
    sys.exit(code)


@main.command("validate")
@click.argument("recipe")
@click.option("--artifact", "artifact_dir", default=None, help="Artifact directory (default: the recipe's).")
@artifacts_option
@click.option("--scenario", "scenarios", multiple=True, help="Run only this scenario (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help=THREADS_HELP)
@click.option("--url", default=None, help="Measure a running `trtpipe serve` at this URL over streaming HTTP "
              "(TTFT/TPOT/ITL at the client) instead of in-process.")
@click.option("--serve", "serve_", is_flag=True, help="Start `trtpipe serve` on a free loopback port for the run "
              "and measure it over HTTP (like --url).")
@click.option("--api-key", default=None, envvar="TRTPIPE_API_KEY", help="API key of the server (--url).")
@click.option("--goodput", is_flag=True, help="Then find each Poisson scenario's goodput: the highest "
              "arrival rate (bisection) at which its budgets hold; writes goodput.json/.png.")
@click.option("--goodput-time-s", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Time limit of the goodput search per scenario (seconds).")
def validate_cmd(recipe: str, artifact_dir: str | None, artifact_root: str, scenarios: tuple[str, ...],
                 as_json: bool, threads: int | None, url: str | None, serve_: bool, api_key: str | None,
                 goodput: bool, goodput_time_s: float) -> None:
    """Validate a built artifact against RECIPE: run each scenario's workload, measure
    TTFT/TPOT/ITL/E2E percentiles, compare with the budgets, and check correctness against the
    golden outputs recorded at build time.

    \b
    Exit code: 0 all budgets and correctness pass; 1 any fails; 2 usage or artifact errors
    (including an artifact not built from RECIPE: the build hashes differ).
    Reports: artifacts/<recipe>/<target>/validate/ (report.json, report.md, PNG plots); a run of
    some scenarios only (--scenario) writes to validate/scenarios-<names>/ and keeps the full one.
    Over HTTP (--url URL or --serve): the same scenarios, report (validate/http/), plots and gate,
    measured at the client; the golden-output check runs in-process only. --goodput then probes
    the server itself (its own scheduler settings; in-process, each scenario's TPOT budget).
    Example: trtpipe validate smollm2-135m-cpu --scenario chat
    """
    from trtpipe.pipeline.validate import run_validate

    try:
        if url is not None or serve_:
            from trtpipe.pipeline.validate_http import run_validate_http

            sys.exit(run_validate_http(recipe, url=url, serve=serve_, artifact_dir=artifact_dir,
                                       artifact_root=artifact_root, scenarios=scenarios, as_json=as_json,
                                       threads=threads, api_key=api_key, goodput=goodput,
                                       goodput_time_s=goodput_time_s))
        code = run_validate(recipe, artifact_dir=artifact_dir, artifact_root=artifact_root,
                            scenarios=scenarios, as_json=as_json, threads=threads, goodput=goodput,
                            goodput_time_s=goodput_time_s)
    except TrtpipeError as e:
        _fail(e)
    sys.exit(code)


@main.command("estimate")
@click.argument("recipe")
@click.option("--target", default=None, type=click.Choice(["cpu", "orin", "a100", "h200"]),
              help="Estimate for this target instead of the recipe's.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def estimate_cmd(recipe: str, target: str | None, as_json: bool) -> None:
    """Predict memory (weights, KV, activations, engines) and TTFT/TPOT rooflines for RECIPE on a
    target, from model facts alone (no weights, no build). Warns when it cannot fit or a budget
    is below the physical floor.

    \b
    Example: trtpipe estimate recipes/llama2-7b-orin.yaml
    """
    from trtpipe.pipeline.estimate import run_estimate

    try:
        sys.exit(run_estimate(recipe, target=target, as_json=as_json))
    except TrtpipeError as e:
        _fail(e)


@main.command("export")
@click.argument("recipe")
@click.option("--out", "out_dir", default=None,
              help="Folder for prefill.onnx / decode.onnx (default: artifacts/<recipe>/<target>-export, "
                   "beside the built artifact, never inside it).")
def export_cmd(recipe: str, out_dir: str | None) -> None:
    """Export the unlowered prefill and decode ONNX graphs (with trtpipe:: custom ops) for RECIPE.

    \b
    Example: trtpipe export smollm2-135m-cpu --out /tmp/graphs
    """
    try:
        from trtpipe.pipeline.build import artifact_dir_for, load_model
        from trtpipe.pipeline.export import export_phase
        from trtpipe.pipeline.model import build_reference_model
        from trtpipe.pipeline.recipe import check_recipe_against_model

        r = _load_recipe(recipe)
        out = Path(out_dir) if out_dir else artifact_dir_for(r).parent / f"{r.target}-export"
        loaded = load_model(r)
        check_recipe_against_model(r, loaded.config)
        for phase in ("prefill", "decode"):
            prec = getattr(r.precision, phase)
            ref = build_reference_model(loaded, prec, r.precision.int4.group_size, r.precision.int4.symmetric,
                                        rope_table_len=r.max_seq_len, sliding_window=r.sliding_window)
            click.echo(f"exporting {phase} ({prec}) ...")
            res = export_phase(ref, phase, out / f"{phase}.onnx", r.kv_cache.block_size)
            click.echo(f"  {res.path} ({res.graph_bytes / 1e6:.1f} MB graph, {res.data_bytes / 1e6:.1f} MB weights, {res.seconds:.1f} s)")
    except TrtpipeError as e:
        _fail(e)


def _info_summary(m) -> dict:
    """The manifest facts ``trtpipe info`` shows (plain JSON types)."""
    bi = m.build_info or {}
    return {
        "artifact": str(Path(m.root).resolve()) if m.root else None,
        "recipe": m.recipe_name, "build_hash": bi.get("build_hash"), "recipe_hash": m.recipe_hash,
        "target": m.target, "backend": m.backend,
        "model": {"name": m.model.name, "num_layers": m.model.num_layers, "hidden_size": m.model.hidden_size,
                  "vocab_size": m.model.vocab_size, "chat_template": bool(m.model.chat_template)},
        "graphs": {ph: {"file": g.file, "precision": g.precision} for ph, g in m.graphs.items()},
        "kv": {"num_blocks": m.kv.num_blocks, "block_size": m.kv.block_size, "dtype": m.kv.dtype,
               "sliding_window": m.kv.sliding_window, "pool_bytes": m.kv.pool_bytes},
        "limits": m.limits,
        "built_at": bi.get("built_at"), "host": bi.get("host"), "rebuild_command": m.rebuild_command,
        "trtpipe_version": m.trtpipe_version,
    }


@main.command("info")
@click.argument("recipe_or_artifact")
@artifacts_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def info_cmd(recipe_or_artifact: str, artifact_root: str, as_json: bool) -> None:
    """Show an artifact's manifest summary (recipe and build hash, backend, target, model,
    precision per phase, KV pool, limits, when and where it was built).

    \b
    RECIPE_OR_ARTIFACT: a recipe (its artifact must be built from it) or an artifact directory.
    Example: trtpipe info smollm2-135m-cpu --json
    """
    import json

    from rich.console import Console
    from rich.table import Table

    from trtpipe.runtime.manifest import load_manifest

    try:
        m = load_manifest(resolve_artifact(recipe_or_artifact, artifact_root))
    except TrtpipeError as e:
        _fail(e)
    d = _info_summary(m)
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    kv, model = d["kv"], d["model"]
    rows = [
        ("artifact", d["artifact"]),
        ("recipe", f"{d['recipe']} (build hash {(d['build_hash'] or d['recipe_hash'])[:12]})"),
        ("target", f"{m.target.get('name')} ({m.target.get('platform')}"
                   + (f", sm_{m.target['sm']})" if m.target.get("sm") else ")")),
        ("backend", f"{m.backend.get('name')} {m.backend.get('version', '')}".strip()),
        ("model", f"{model['name']}: {model['num_layers']} layers, hidden {model['hidden_size']}, "
                  f"vocab {model['vocab_size']}, chat template {'yes' if model['chat_template'] else 'no'}"),
        *((f"{ph} graph", f"{g['file']} ({g['precision']})") for ph, g in d["graphs"].items()),
        ("KV pool", f"{kv['num_blocks']} blocks x {kv['block_size']} tokens, {kv['dtype']}, "
                    f"{kv['pool_bytes'] / 2**20:.0f} MiB" + (f", window {kv['sliding_window']}" if kv["sliding_window"] else "")),
        ("limits", ", ".join(f"{k} {v}" for k, v in d["limits"].items())),
        ("built", f"{d['built_at'] or '?'} on {d['host'] or '?'} (trtpipe {d['trtpipe_version']})"),
        ("rebuild", d["rebuild_command"]),
    ]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, v)
    Console(highlight=False).print(table)


from trtpipe.pipeline.cli_serve import serve_cmd  # noqa: E402 - registered after the group exists

main.add_command(serve_cmd)

from trtpipe.pipeline.farm.cli import farm_group, pull_cmd  # noqa: E402  (click only; ray/fsspec lazily)

main.add_command(farm_group)
main.add_command(pull_cmd)


if __name__ == "__main__":
    main()
