"""``trtpipe build`` and ``trtpipe export``: recipe -> artifact, and the unlowered ONNX graphs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from trtpipe.pipeline.cli.common import EXIT_NEEDS_TARGET, artifacts_option, fail, load_recipe_arg
from trtpipe.plugins.core.errors import TrtpipeError


def _plain_log(msg: str) -> None:
    """A build step's line where stderr is no terminal: rich's log wrapped it at 80 columns and
    tagged it with a source line (``build.py:66``)."""
    click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)


@click.command("build")
@click.argument("recipe")
@artifacts_option
@click.option(
    "--force",
    is_flag=True,
    help="Rebuild even if the inputs (recipe, model, versions) are unchanged; "
    "the previous artifact's validate reports are kept under validate/previous-<build hash>/.",
)
@click.option(
    "--from-spec",
    "from_spec",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Finish a GPU build on the target machine from the build_spec.json a CPU machine wrote.",
)
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
    from trtpipe.pipeline.stages import BuildNeedsTarget

    try:
        if from_spec:
            from trtpipe.pipeline.stages import build_from_spec

            build_from_spec(Path(from_spec), log=click.echo)
            return
        import signal

        from rich.console import Console

        from trtpipe.pipeline.stages import build

        # SIGTERM (timeout, CI cancel) unwinds like Ctrl-C, so the build removes its temp folder
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

        r = load_recipe_arg(recipe)
        console = Console(stderr=True, log_path=False)
        if not console.is_terminal:  # a CI log or a pipe: one unwrapped "[HH:MM:SS] step" line per step
            res = build(r, artifact_root, force=force, log=_plain_log)
        else:
            with console.status(f"building {r.name} for {r.target} ...") as status:

                def log(msg: str) -> None:  # a spinner on the long steps, a timestamped line per step
                    console.log(msg)
                    status.update(msg)

                res = build(r, artifact_root, force=force, log=log)
        if not res.skipped:
            click.echo(f"built {res.artifact_dir} in {res.seconds:.1f} s")
    except BuildNeedsTarget as e:
        click.echo(click.style("build spec written, finish on the target: ", fg="yellow", bold=True) + str(e), err=True)
        sys.exit(EXIT_NEEDS_TARGET)
    except TrtpipeError as e:
        fail(e)


@click.command("export")
@click.argument("recipe")
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="Folder for prefill.onnx / decode.onnx (default: artifacts/<recipe>/<target>-export, "
    "beside the built artifact, never inside it).",
)
def export_cmd(recipe: str, out_dir: str | None) -> None:
    """Export the unlowered prefill and decode ONNX graphs (with trtpipe:: custom ops) for RECIPE.

    \b
    Example: trtpipe export smollm2-135m-cpu --out /tmp/graphs
    """
    try:
        from trtpipe.pipeline.model.reference import build_reference_model
        from trtpipe.pipeline.recipe import check_recipe_against_model
        from trtpipe.pipeline.stages import artifact_dir_for, load_model
        from trtpipe.pipeline.stages.export import export_phase

        r = load_recipe_arg(recipe)
        out = Path(out_dir) if out_dir else artifact_dir_for(r).parent / f"{r.target}-export"
        loaded = load_model(r)
        check_recipe_against_model(r, loaded.config)
        for phase in ("prefill", "decode"):
            prec = getattr(r.precision, phase)
            ref = build_reference_model(
                loaded,
                prec,
                r.precision.int4.group_size,
                r.precision.int4.symmetric,
                rope_table_len=r.max_seq_len,
                sliding_window=r.sliding_window,
            )
            click.echo(f"exporting {phase} ({prec}) ...")
            res = export_phase(ref, phase, out / f"{phase}.onnx", r.kv_cache.block_size)
            click.echo(
                f"  {res.path} ({res.graph_bytes / 1e6:.1f} MB graph, {res.data_bytes / 1e6:.1f} MB weights, "
                f"{res.seconds:.1f} s)"
            )
    except TrtpipeError as e:
        fail(e)
