"""The ``trtpipe`` command line (click). Heavy imports happen inside each command, so
``trtpipe --help`` and ``trtpipe generate`` work without torch installed.

Exit codes: 0 success; 1 a validate budget or correctness check failed; 2 usage, recipe or
artifact errors (click's own usage errors are 2 as well).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from trtpipe.plugins.errors import TrtpipeError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _fail(e: Exception) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + str(e), err=True)
    sys.exit(EXIT_USAGE)


def _load_recipe(recipe: str):
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    return load_recipe(resolve_recipe_path(recipe))


def resolve_artifact(recipe_or_artifact: str, artifact_root: str = "artifacts") -> Path:
    """An artifact directory, or a recipe (path or shipped name) -> its artifact directory."""
    p = Path(recipe_or_artifact)
    if p.is_dir() and (p / "manifest.json").is_file():
        return p
    from trtpipe.pipeline.build import artifact_dir_for

    try:
        recipe = _load_recipe(recipe_or_artifact)
    except TrtpipeError as e:
        if p.is_dir():
            raise TrtpipeError(f"{p} is not a trtpipe artifact (no manifest.json). Fix: run `trtpipe build RECIPE` "
                               "and pass the recipe or the directory it prints.") from None
        raise e
    d = artifact_dir_for(recipe, artifact_root)
    if not (d / "manifest.json").is_file():
        raise TrtpipeError(f"no artifact for recipe {recipe.name!r} at {d}. Fix: run `trtpipe build {recipe_or_artifact}` first.")
    return d


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
    """


@main.command("recipes")
def recipes_cmd() -> None:
    """List the shipped recipes."""
    from trtpipe.pipeline.recipe import shipped_recipe_names

    for n in shipped_recipe_names():
        click.echo(n)


@main.command("build")
@click.argument("recipe")
@click.option("--artifacts", "artifact_root", default="artifacts", show_default=True,
              help="Root folder for artifacts (<root>/<recipe>/<target>).")
@click.option("--force", is_flag=True, help="Rebuild even if the inputs (recipe, model, versions) are unchanged.")
@click.option("--from-spec", "from_spec", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Finish a GPU build on the target machine from the build_spec.json a CPU machine wrote.")
def build_cmd(recipe: str, artifact_root: str, force: bool, from_spec: str | None) -> None:
    """Build the artifact for RECIPE: load the model, export the prefill and decode ONNX graphs,
    lower them for the target's backend (ONNX Runtime for cpu, TensorRT plans for GPUs), record
    golden outputs and write manifest.json.

    \b
    Output: artifacts/<recipe>/<target>/ (manifest.json, prefill.onnx, decode.onnx, weights.data,
    tokenizer.json, golden.json). Writes are atomic: a failed build keeps the previous artifact.
    Example: trtpipe build smollm2-135m-cpu
    """
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
    except TrtpipeError as e:
        _fail(e)


@main.command("generate")
@click.argument("recipe_or_artifact")
@click.argument("prompt")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int, help="Most tokens to generate.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="1.0 = off.")
@click.option("--seed", default=None, type=int, help="Seed for sampling (reproducible).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it arrives.")
@click.option("--artifacts", "artifact_root", default="artifacts", show_default=True)
@click.option("--threads", default=None, type=int, help="ONNX Runtime intra-op threads.")
def generate_cmd(recipe_or_artifact: str, prompt: str, chat: bool, max_new_tokens: int, temperature: float,
                 top_k: int, top_p: float, seed: int | None, stop: tuple[str, ...], stream: bool,
                 artifact_root: str, threads: int | None) -> None:
    """Generate text for PROMPT with a built artifact (no torch needed).

    \b
    RECIPE_OR_ARTIFACT: a recipe (its artifact must be built) or an artifact directory.
    Ends with the request's TTFT and TPOT.
    Example: trtpipe generate smollm2-135m-cpu "What is the capital of France?" --chat
    """
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.request import SamplingParams

    try:
        art = resolve_artifact(recipe_or_artifact, artifact_root)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, stop=stop).validate()
        llm = LLM(art, num_threads=threads)
        if stream:
            for piece in llm.stream(prompt, params, chat=chat):
                click.echo(piece, nl=False)
            out = llm.last_output
            click.echo()
        else:
            out = llm.generate([prompt], params, chat=chat)[0]
            click.echo(out.text)
    except TrtpipeError as e:
        _fail(e)
    m = out.metrics
    tpot = f"{m.tpot_s * 1e3:.1f} ms" if m.tpot_s is not None else "n/a (1 token)"
    ttft = f"{m.ttft_s * 1e3:.1f} ms" if m.ttft_s is not None else "n/a"
    click.echo(click.style(f"[{out.finish_reason}] {m.output_tokens} tokens, TTFT {ttft}, TPOT {tpot}", dim=True), err=True)
    if out.finish_reason == "error":
        click.echo(f"error: {out.error_message}", err=True)
        sys.exit(EXIT_FAILED)


@main.command("validate")
@click.argument("recipe")
@click.option("--artifact", "artifact_dir", default=None, help="Artifact directory (default: the recipe's).")
@click.option("--artifacts", "artifact_root", default="artifacts", show_default=True)
@click.option("--scenario", "scenarios", multiple=True, help="Run only this scenario (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--threads", default=None, type=int, help="ONNX Runtime intra-op threads.")
def validate_cmd(recipe: str, artifact_dir: str | None, artifact_root: str, scenarios: tuple[str, ...],
                 as_json: bool, threads: int | None) -> None:
    """Validate a built artifact against RECIPE: run each scenario's workload, measure
    TTFT/TPOT/ITL/E2E percentiles, compare with the budgets, and check correctness against the
    golden outputs recorded at build time.

    \b
    Exit code: 0 all budgets and correctness pass; 1 any fails; 2 usage or artifact errors.
    Reports: artifacts/<recipe>/<target>/validate/ (report.json, report.md, PNG plots); a run of
    some scenarios only (--scenario) writes to validate/scenarios-<names>/ and keeps the full one.
    Example: trtpipe validate smollm2-135m-cpu --scenario chat
    """
    from trtpipe.pipeline.validate import run_validate

    try:
        code = run_validate(recipe, artifact_dir=artifact_dir, artifact_root=artifact_root,
                            scenarios=scenarios, as_json=as_json, threads=threads)
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
@click.option("--out", "out_dir", default=None, help="Folder for prefill.onnx / decode.onnx (default: artifacts/<recipe>/<target>/export).")
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


@main.command("info")
@click.argument("recipe_or_artifact")
@click.option("--artifacts", "artifact_root", default="artifacts", show_default=True)
def info_cmd(recipe_or_artifact: str, artifact_root: str) -> None:
    """Show an artifact's manifest summary (backend, target, precision, KV pool, files)."""
    from trtpipe.runtime.manifest import load_manifest

    try:
        m = load_manifest(resolve_artifact(recipe_or_artifact, artifact_root))
    except TrtpipeError as e:
        _fail(e)
    click.echo(f"recipe {m.recipe_name} ({m.recipe_hash[:12]}), backend {m.backend}, target {m.target}")
    click.echo(f"model {m.model.name}: {m.model.num_layers} layers, hidden {m.model.hidden_size}, vocab {m.model.vocab_size}")
    for ph, g in m.graphs.items():
        click.echo(f"  {ph}: {g.file} ({g.precision})")
    click.echo(f"KV pool: {m.kv.num_blocks} blocks x {m.kv.block_size} tokens, {m.kv.dtype}, {m.kv.pool_bytes / 2**20:.0f} MiB")


from trtpipe.pipeline.farm.cli import farm_group, pull_cmd  # noqa: E402  (click only; ray/fsspec lazily)

main.add_command(farm_group)
main.add_command(pull_cmd)


if __name__ == "__main__":
    main()
