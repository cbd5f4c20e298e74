"""CLI: ``trtpipe farm build``, ``trtpipe farm node``, ``trtpipe pull`` (registered in
:mod:`trtpipe.pipeline.cli.main`). Ray and fsspec are imported inside the commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

from trtpipe.pipeline.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, artifacts_option
from trtpipe.pipeline.targets import TARGET_FAMILIES
from trtpipe.plugins.core.errors import TrtpipeError

TARGETS = TARGET_FAMILIES


def _fail(e: Exception) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + str(e), err=True)
    sys.exit(EXIT_USAGE)


def _need_farm_extra() -> None:
    import importlib.util

    missing = [m for m in ("ray", "fsspec") if importlib.util.find_spec(m) is None]
    if missing:
        _fail(
            TrtpipeError(f"the farm needs {', '.join(missing)}, not installed here. Fix: pip install 'trtpipe[farm]'")
        )


def _targets(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    out = tuple(t.strip() for t in value.split(",") if t.strip())
    bad = [t for t in out if t not in TARGETS]
    if bad:
        raise click.BadParameter(
            f"unknown target(s) {', '.join(bad)}; expected a comma-separated subset of {','.join(TARGETS)}",
            param_hint="--targets",
        )
    return out


_store_option = click.option(
    "--store",
    "store_url",
    envvar="TRTPIPE_STORE",
    required=True,
    help="Artifact store: a folder or an fsspec URL (env TRTPIPE_STORE).",
)


@click.group("farm")
def farm_group() -> None:
    """Build farm on Ray: every recipe on a node that has its target's hardware, artifacts
    published to a store, a matrix report CI can gate on (docs/farm.md).

    \b
    On each machine of the farm, once:   trtpipe farm node --target orin --address HEAD:6379 --run
    From CI or a laptop:                 trtpipe farm build recipes/*.yaml --store s3://bucket/trtpipe --validate
    On the device:                       trtpipe pull smollm2-135m-orin --target orin --store s3://bucket/trtpipe
    """


@farm_group.command("build")
@click.argument("recipes", nargs=-1, required=True)
@click.option(
    "--targets",
    default=None,
    help="Comma-separated targets to build (cpu,orin,a100,h200); "
    "recipes for other targets are left out. Default: every recipe's own target.",
)
@click.option(
    "--address",
    default=None,
    help="Ray cluster: 'auto', HOST:PORT or ray://HOST:10001. Default: a "
    "local Ray instance on 127.0.0.1 that advertises the cpu target.",
)
@_store_option
@click.option(
    "--validate", is_flag=True, help="Run `trtpipe validate` on the node after the build; publish only on PASS."
)
@click.option("--scenario", "scenarios", multiple=True, help="With --validate: only this scenario (repeatable).")
@click.option(
    "--work-dir",
    default="~/.cache/trtpipe/farm",
    show_default=True,
    envvar="TRTPIPE_FARM_WORK_DIR",
    help="Artifacts root on each node (trtpipe build --artifacts there); env TRTPIPE_FARM_WORK_DIR.",
)
@click.option(
    "--report", "report_dir", default="farm-report", show_default=True, help="Folder for matrix.md and matrix.json."
)
@click.option("--force", is_flag=True, help="Rebuild and republish cells already in the store.")
@click.option(
    "--max-retries",
    default=1,
    show_default=True,
    type=click.IntRange(0, 10),
    help="Re-runs of a cell whose node died (on another node with the resource).",
)
@click.option(
    "--timeout-s",
    default=4 * 3600,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Cancel cells still running after this many seconds.",
)
def farm_build_cmd(
    recipes: tuple[str, ...],
    targets: str | None,
    address: str | None,
    store_url: str,
    validate: bool,
    scenarios: tuple[str, ...],
    work_dir: str,
    report_dir: str,
    force: bool,
    max_retries: int,
    timeout_s: float,
) -> None:
    """Build (and validate) each RECIPE on a node that advertises its target, and publish the
    artifacts to the store: one Ray task per (recipe, target).

    \b
    Cells already in the store (same build hash) are skipped; a target no node advertises, or
    whose nodes lack the memory the build needs (trtpipe estimate), fails at once.
    Report: <report>/matrix.md and matrix.json (also printed).
    Exit code: 0 all cells published or in the store; 1 any cell failed; 3 none failed but GPU
    cells stopped at their build spec (no TensorRT on the node); 2 usage; 130 Ctrl-C.
    Example: trtpipe farm build recipes/*.yaml --store ./store --validate
    """
    _need_farm_extra()
    import time

    from trtpipe.pipeline.farm.matrix import exit_code, to_markdown, write_matrix
    from trtpipe.pipeline.farm.run import FarmOptions, farm_build

    opts = FarmOptions(
        store_url=store_url,
        address=address,
        targets=_targets(targets),
        validate=validate,
        scenarios=scenarios,
        work_dir=work_dir,
        force=force,
        max_retries=max_retries,
        timeout_s=timeout_s,
    )
    t0 = time.perf_counter()
    try:
        results, interrupted = farm_build(recipes, opts, log=lambda s: click.echo(f"farm: {s}", err=True))
    except TrtpipeError as e:
        _fail(e)
    wall = time.perf_counter() - t0
    paths = write_matrix(results, report_dir, store_url=store_url, address=address, wall_s=wall)
    click.echo(to_markdown(results, store_url=store_url, wall_s=wall))
    click.echo(f"matrix: {paths.markdown} and {paths.json}", err=True)
    sys.exit(EXIT_INTERRUPTED if interrupted else exit_code(results))


@farm_group.command("node")
@click.option("--target", required=True, type=click.Choice(TARGETS), help="The target this node builds for.")
@click.option("--address", default=None, help="Head node HOST:PORT to join; without it, start a head node.")
@click.option("--num-cpus", default=None, type=int, help="CPUs Ray may use on this node (default: Ray's).")
@click.option("--run", "run_it", is_flag=True, help="Run the `ray start` command instead of printing it.")
@click.option("--json", "as_json", is_flag=True, help="Print the probe as JSON.")
def farm_node_cmd(target: str, address: str | None, num_cpus: int | None, run_it: bool, as_json: bool) -> None:
    """Probe this machine (GPU SM through nvidia-smi, Jetson, TensorRT version, memory) and print
    the `ray start` command that makes it a farm node for TARGET; refuse a target it cannot build.

    \b
    Exit code: 0 the node can build TARGET (command printed or run); 1 it cannot (the reason is
    printed); 2 usage.
    Example: trtpipe farm node --target orin --address 10.0.0.5:6379 --run
    """
    from trtpipe.pipeline.farm.node import format_command, probe_node, ray_start_command, refusal

    probe = probe_node()
    why = refusal(probe, target)
    if as_json:
        click.echo(json.dumps({"probe": probe.to_dict(), "target": target, "refused": why}, indent=1))
    else:
        gpus = ", ".join(f"{g.name} sm_{g.sm}" for g in probe.gpus) or "none"
        click.echo(
            f"node {probe.hostname}: {probe.platform}, {probe.num_cpus} CPUs, "
            f"{probe.memory_bytes / 2**30:.1f} GiB memory ({probe.memory_available_bytes / 2**30:.1f} GiB "
            f"available), GPUs: {gpus}, Jetson: {probe.jetson or 'no'}, TensorRT: "
            f"{probe.tensorrt_version or 'not importable'}",
            err=True,
        )
    if why is not None:
        click.echo(
            click.style("refused: ", fg="red", bold=True) + f"this node cannot build target {target}: {why}.", err=True
        )
        sys.exit(1)
    cmd = ray_start_command(target, address, num_cpus)
    if not run_it:
        if not as_json:
            click.echo(format_command(cmd))
        return
    _need_farm_extra()
    click.echo(f"running: {format_command(cmd)}", err=True)
    sys.exit(subprocess.call(cmd, env=dict(os.environ)))


@click.command("pull")
@click.argument("recipe")
@click.option("--target", required=True, type=click.Choice(TARGETS), help="Which target's artifact.")
@_store_option
@click.option("--dest", default=None, help="Where to put it (default: <artifacts>/<recipe>/<target>).")
@artifacts_option
@click.option("--build-hash", default=None, help="A specific build instead of `latest`.")
def pull_cmd(
    recipe: str, target: str, store_url: str, dest: str | None, artifact_root: str, build_hash: str | None
) -> None:
    """Fetch the latest published artifact of RECIPE for TARGET from the store and verify it on
    this device (every file's sha256 against the store record, then the runtime's manifest
    checks: hashes, format, backend version, op ABI, platform) before it replaces anything.

    \b
    RECIPE: a recipe name (or a recipe file: its name is used).
    Exit code: 0 pulled and verified; 2 nothing published, corrupted copy, or it does not fit
    this device (the previous artifact at --dest is left as it was).
    Example: trtpipe pull smollm2-135m-cpu --target cpu --store ./store && trtpipe generate
             artifacts/smollm2-135m-cpu/cpu "What is the capital of France?" --chat
    """
    _need_farm_extra()
    from trtpipe.pipeline.farm.pull import pull

    name = recipe
    if recipe.endswith((".yaml", ".yml")) and Path(recipe).is_file():
        from trtpipe.pipeline.recipe import load_recipe

        try:
            name = load_recipe(recipe, check_files=False).name
        except TrtpipeError as e:
            _fail(e)
    out = Path(dest) if dest else Path(artifact_root) / name / target
    try:
        res = pull(store_url, name, target, out, build_hash=build_hash, log=lambda s: click.echo(s, err=True))
    except TrtpipeError as e:
        _fail(e)
    click.echo(str(res.artifact_dir))
