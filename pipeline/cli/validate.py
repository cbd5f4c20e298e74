"""``trtpipe validate`` (budgets and correctness of a built artifact, in-process or over HTTP) and
``trtpipe estimate`` (memory and latency floors before a build)."""

from __future__ import annotations

import sys

import click

from trtpipe.pipeline.cli.common import THREADS_HELP, artifacts_option, fail
from trtpipe.pipeline.targets import TARGET_FAMILIES
from trtpipe.plugins.core.errors import TrtpipeError


@click.command("validate")
@click.argument("recipe")
@click.option("--artifact", "artifact_dir", default=None, help="Artifact directory (default: the recipe's).")
@artifacts_option
@click.option("--scenario", "scenarios", multiple=True, help="Run only this scenario (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help=THREADS_HELP)
@click.option(
    "--url",
    default=None,
    help="Measure a running `trtpipe serve` at this URL over streaming HTTP "
    "(TTFT/TPOT/ITL at the client) instead of in-process.",
)
@click.option(
    "--serve",
    "serve_",
    is_flag=True,
    help="Start `trtpipe serve` on a free loopback port for the run and measure it over HTTP (like --url).",
)
@click.option(
    "--api-key",
    default=None,
    envvar="TRTPIPE_API_KEY",
    show_envvar=True,
    help="API key of the server (--url): sent as 'Authorization: Bearer KEY'; default: $TRTPIPE_API_KEY "
    "(what `trtpipe serve --api-key` reads too).",
)
@click.option(
    "--goodput",
    is_flag=True,
    help="Then find each Poisson scenario's goodput: the highest "
    "arrival rate (bisection) at which its budgets hold; writes goodput.json/.png.",
)
@click.option(
    "--goodput-time-s",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Time limit of the goodput search per scenario (seconds).",
)
def validate_cmd(
    recipe: str,
    artifact_dir: str | None,
    artifact_root: str,
    scenarios: tuple[str, ...],
    as_json: bool,
    threads: int | None,
    url: str | None,
    serve_: bool,
    api_key: str | None,
    goodput: bool,
    goodput_time_s: float,
) -> None:
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
    the server itself (its own scheduler settings). In process, the slo scheduler keeps each
    scenario's tpot_ms / itl_ms budgets and itl_during_prefill_ratio where runtime.scheduler sets none.
    Example: trtpipe validate smollm2-135m-cpu --scenario chat
    """
    from trtpipe.pipeline.validate.runner import run_validate

    try:
        if url is not None or serve_:
            from trtpipe.pipeline.validate.http import run_validate_http

            sys.exit(
                run_validate_http(
                    recipe,
                    url=url,
                    serve=serve_,
                    artifact_dir=artifact_dir,
                    artifact_root=artifact_root,
                    scenarios=scenarios,
                    as_json=as_json,
                    threads=threads,
                    api_key=api_key,
                    goodput=goodput,
                    goodput_time_s=goodput_time_s,
                )
            )
        code = run_validate(
            recipe,
            artifact_dir=artifact_dir,
            artifact_root=artifact_root,
            scenarios=scenarios,
            as_json=as_json,
            threads=threads,
            goodput=goodput,
            goodput_time_s=goodput_time_s,
        )
    except TrtpipeError as e:
        fail(e)
    sys.exit(code)


@click.command("estimate")
@click.argument("recipe")
@click.option(
    "--target",
    default=None,
    type=click.Choice(TARGET_FAMILIES),
    help="Estimate for this target instead of the recipe's.",
)
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
        fail(e)
