"""``trtpipe serve``: the OpenAI-compatible HTTP server (registered in :mod:`trtpipe.pipeline.cli.main`).

The server itself lives in :mod:`trtpipe.runtime.serve` (no torch); this is only the command line.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from trtpipe.pipeline.cli.common import THREADS_HELP, artifacts_option
from trtpipe.runtime.serve.defaults import DEFAULT_MAX_QUEUE_WAIT_MS, DEFAULT_MAX_REQUEST_BYTES


def _finite_ms(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's FloatRange lets ``nan`` and ``inf`` through; a budget must be a finite number."""
    if value is not None and not math.isfinite(value):
        example = 100 if param.name == "itl_budget_ms" else 50
        raise click.BadParameter(f"{value}: expected a finite number of ms > 0, e.g. {example}")
    return value


def _finite_ratio(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A ratio > 1 and finite (a step beside decodes always takes longer than the decodes alone)."""
    if value is not None and not (math.isfinite(value) and value > 1):
        raise click.BadParameter(
            f"{value}: expected a finite number > 1 (the longest step beside decodes over the decode-only step), e.g. 1.5"
        )
    return value


def _budget_ms_option(flag: str, help: str):  # noqa: A002 - click's name
    """A ``--*-budget-ms`` option: a finite number of ms > 0, or absent (the recipe's value)."""
    return click.option(flag, type=click.FloatRange(min=0, min_open=True), default=None, callback=_finite_ms, help=help)


def _need_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        click.echo(
            f"error: `trtpipe serve` needs the serve extra ({e.name} is not installed). "
            "Fix: pip install 'trtpipe[serve]'",
            err=True,
        )
        sys.exit(2)


@click.command("serve")
@click.argument("recipe_or_artifact")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port; 0: any free port (the listening line names it).",
)
@click.option(
    "--max-queued-requests",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most requests waiting for admission; past it new ones get 503 with Retry-After.",
)
@click.option(
    "--request-timeout-s",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help='Cancel a request still running this long after arrival (finish_reason "timeout"). Default: no limit.',
)
@click.option(
    "--api-key",
    default=None,
    envvar="TRTPIPE_API_KEY",
    show_envvar=True,
    help="Require 'Authorization: Bearer KEY' on /v1 and /tokenize (401 otherwise).",
)
@click.option(
    "--shutdown-grace-s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM/SIGINT: how long running requests may finish before they are cancelled.",
)
@artifacts_option
@click.option("--threads", default=None, type=click.IntRange(min=1), help=THREADS_HELP)
@click.option(
    "--no-prefix-caching",
    is_flag=True,
    help="Turn automatic prefix caching off (overrides the recipe's runtime.prefix_caching).",
)
@click.option(
    "--scheduler-policy",
    type=click.Choice(["slo", "fcfs"]),
    default=None,
    help="Override the recipe's runtime.scheduler.policy (artifact folder: slo).",
)
@_budget_ms_option(
    "--tpot-budget-ms",
    "Override the recipe's runtime.scheduler.tpot_budget_ms: the TPOT the slo policy sizes prefill "
    "chunks for (neither given: derived at start, see the start line).",
)
@_budget_ms_option(
    "--itl-budget-ms",
    "Override the recipe's runtime.scheduler.itl_budget_ms: the longest token gap accepted; the slo "
    "policy then plans steps up to 0.8x it while each request's TPOT stays within the TPOT budget "
    "(neither budget given: derived, 2x the TPOT budget). Without a TPOT budget it is also "
    "the TPOT budget; refused under --scheduler-policy fcfs.",
)
@click.option(
    "--itl-during-prefill-ratio",
    type=float,
    default=None,
    callback=_finite_ratio,
    help="Override the recipe's runtime.scheduler.itl_during_prefill_ratio: a step that prefills "
    "beside decodes takes at most this many decode-only steps (e.g. 1.5), chunks down to one token: "
    "decoding streams keep their pace while a long prompt prefills, and that prompt's TTFT grows. "
    "Refused under --scheduler-policy fcfs.",
)
@click.option(
    "--speculative",
    type=click.Choice(["ngram", "off"]),
    default=None,
    help="Speculative decoding without a draft model: ngram proposals of the request's own context, "
    "verified in one prefill-path chunk, sized from the verify cost measured at start (greedy outputs "
    "unchanged on the native engine; on ONNX Runtime they may differ at near-ties). Overrides the "
    "recipe's runtime.speculative (whose max_k/min_n/max_n it keeps); artifact folder: off. "
    'A request may opt out with "speculative": false.',
)
@click.option(
    "--speculative-max-k",
    type=click.IntRange(1, 16),
    default=None,
    help="Most proposed tokens verified per request and step (recipe runtime.speculative.max_k; default 4).",
)
@click.option(
    "--speculative-ngram",
    type=(click.IntRange(1, 16), click.IntRange(1, 16)),
    default=None,
    metavar="MIN_N MAX_N",
    help="N-gram lengths matched, longest first (recipe runtime.speculative.min_n/max_n; default 2 4).",
)
@click.option(
    "--max-queue-wait-ms",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_QUEUE_WAIT_MS,
    show_default=True,
    callback=_finite_ms,
    help="Refuse a request (503 + Retry-After) when the work ahead of it is predicted (step-cost model) to "
    "delay its prefill longer than this; 0: no such limit (requests queue, TTFT grows without bound).",
)
@click.option(
    "--max-request-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_REQUEST_BYTES,
    show_default=True,
    help="Largest request body; a larger one gets 413 before it is parsed.",
)
@click.option(
    "--no-warm-up",
    is_flag=True,
    help="Skip the warm-up before the ready line (the first requests then run cold; to measure the difference).",
)
@click.option(
    "--logprobs-mode",
    type=click.Choice(["raw", "processed"]),
    default="raw",
    show_default=True,
    help="What logprobs report (vLLM's --logprobs-mode): raw = log-softmax of the model's logits; "
    "processed = of the logits sampled from (after logit_bias, penalties, the schema mask, temperature).",
)
def serve_cmd(
    recipe_or_artifact: str,
    host: str,
    port: int,
    max_queued_requests: int,
    request_timeout_s: float | None,
    api_key: str | None,
    shutdown_grace_s: float,
    artifact_root: str,
    threads: int | None,
    no_prefix_caching: bool,
    scheduler_policy: str | None,
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    itl_during_prefill_ratio: float | None,
    speculative: str | None,
    speculative_max_k: int | None,
    speculative_ngram: tuple[int, int] | None,
    max_queue_wait_ms: float,
    max_request_bytes: int,
    no_warm_up: bool,
    logprobs_mode: str,
) -> None:
    """Serve a built artifact over an OpenAI-compatible HTTP API (no torch needed).

    \b
    Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: Server-Sent Events),
    GET /v1/models, GET /health (503 while loading), GET /metrics (Prometheus, trtpipe:*),
    POST /tokenize, POST /detokenize. The model name is the recipe name.
    A client that disconnects has its request cancelled and its KV blocks freed at once.
    SIGTERM/SIGINT: stop admitting, let running requests finish (--shutdown-grace-s), exit 0.

    \b
    Runtime settings (printed at start, with the prefill chunk size they give):
      RECIPE           runtime.prefix_caching and runtime.scheduler (policy, tpot_budget_ms,
                       itl_budget_ms, itl_during_prefill_ratio); not the validate scenarios'
                       budgets (one workload each; a server sees them all). Without a scheduler
                       budget serve derives TPOT 50 / ITL 100 ms, raised when a full decode batch
                       is too slow (the start line says); an ITL budget alone is also the TPOT budget.
      ARTIFACT folder  the defaults: prefix caching on, policy slo, derived budgets.
    Before the ready line the engine is warmed up (every decode batch and prefill chunk size, the
    KV pool, one request); the line says how long it took.
      RECIPE           runtime.speculative (absent: off); ARTIFACT folder: off.
      --no-prefix-caching, --scheduler-policy, --tpot-budget-ms, --itl-budget-ms,
      --itl-during-prefill-ratio, --speculative override either.
    Requests may send cache_salt (vLLM's field): prefix-cache blocks are shared only within a salt.

    \b
    Example:
      trtpipe serve smollm2-135m-cpu --port 8000
      python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='-');
        print(c.chat.completions.create(model='smollm2-135m-cpu', temperature=0,
              messages=[{'role': 'user', 'content': 'What is the capital of France?'}]).choices[0].message.content)"
    """
    from trtpipe.pipeline.cli.common import fail as _fail
    from trtpipe.plugins.core.errors import TrtpipeError

    _need_serve_extra()  # before the runtime imports below: they need the serve extra
    from trtpipe.runtime.artifact.manifest import load_manifest
    from trtpipe.runtime.serve.server import ServeConfig, serve

    try:
        art, settings, source = serve_settings(recipe_or_artifact, artifact_root)
        name = load_manifest(art, verify_hashes=False).recipe_name
    except TrtpipeError as e:
        _fail(e)
    overrides = _overrides(no_prefix_caching, scheduler_policy, tpot_budget_ms, itl_budget_ms, itl_during_prefill_ratio)
    if (spec_flags := (speculative, speculative_max_k, speculative_ngram)) != (None, None, None):
        overrides["speculative"] = _speculative(settings.get("speculative"), *spec_flags)
    settings.update(overrides)
    if problem := _unused_itl_flags(settings, itl_budget_ms, itl_during_prefill_ratio):
        _fail(TrtpipeError(problem))
    if overrides:
        source += "; overridden: " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    click.echo(f"trtpipe serve: runtime settings from {source}", err=True)
    cfg = ServeConfig(
        artifact_dir=art, model_name=name, host=host, port=port,
        max_queued_requests=max_queued_requests,
        request_timeout_s=request_timeout_s,
        api_key=api_key,
        shutdown_grace_s=shutdown_grace_s,
        num_threads=threads,
        logprobs_mode=logprobs_mode,
        max_queue_wait_ms=max_queue_wait_ms or None,
        max_request_bytes=max_request_bytes,
        warm_up=not no_warm_up,
        **settings,
    )  # fmt: skip
    sys.exit(serve(cfg, echo=lambda s: click.echo(s, err=True)))


def _speculative(base, mode: str | None, max_k: int | None, ngram: tuple[int, int] | None, fail_now: bool = True):
    """The SpeculativeConfig the flags give on top of the recipe's (``base``, None = off): ``--speculative
    off`` turns it off; ``ngram`` or a size flag turns it on with the flags' values over ``base``'s.
    Raises TrtpipeError for a size flag with ``--speculative off`` or min_n > max_n (``fail_now``:
    the CLI's exit 2 with the message instead)."""
    from trtpipe.plugins.core.errors import TrtpipeError

    try:
        return _speculative_config(base, mode, max_k, ngram)
    except TrtpipeError as e:
        if not fail_now:
            raise
        from trtpipe.pipeline.cli.common import fail

        fail(e)


def _speculative_config(base, mode: str | None, max_k: int | None, ngram: tuple[int, int] | None):
    from dataclasses import replace

    from trtpipe.plugins.core.errors import TrtpipeError
    from trtpipe.runtime.speculative.config import SpeculativeConfig

    if mode == "off":
        if max_k is not None or ngram is not None:
            raise TrtpipeError(
                "--speculative-max-k / --speculative-ngram with --speculative off: they size speculation "
                "that is off. Fix: drop them, or use --speculative ngram"
            )
        return None
    cfg = base or SpeculativeConfig()
    if max_k is not None:
        cfg = replace(cfg, max_k=max_k)
    if ngram is not None:
        cfg = replace(cfg, min_n=ngram[0], max_n=ngram[1])
    return cfg


def _overrides(
    no_prefix_caching: bool,
    scheduler_policy: str | None,
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    itl_during_prefill_ratio: float | None = None,
) -> dict:
    """The runtime settings the flags override (the ones given)."""
    overrides = {
        "prefix_caching": False if no_prefix_caching else None,
        "scheduler_policy": scheduler_policy,
        "tpot_budget_ms": tpot_budget_ms,
        "itl_budget_ms": itl_budget_ms,
        "itl_during_prefill_ratio": itl_during_prefill_ratio,
    }
    return {k: v for k, v in overrides.items() if v is not None}


def _unused_itl_flags(
    settings: dict, itl_budget_ms: float | None, itl_during_prefill_ratio: float | None
) -> str | None:
    """The first of ``--itl-budget-ms`` / ``--itl-during-prefill-ratio`` given that would change
    nothing under ``settings``, as :func:`_unused_itl_flag` says it; None when both apply."""
    flags = (("--itl-budget-ms", itl_budget_ms), ("--itl-during-prefill-ratio", itl_during_prefill_ratio))
    problems = (_unused_itl_flag(flag, value, settings) for flag, value in flags if value is not None)
    return next((p for p in problems if p), None)


def _unused_itl_flag(flag: str, value: float, settings: dict) -> str | None:
    """Why ``flag`` (``--itl-budget-ms`` or ``--itl-during-prefill-ratio``) would change nothing
    under ``settings`` (policy fcfs) and the fix; None when it applies (without a TPOT budget an ITL
    budget is also the TPOT budget)."""
    if settings["scheduler_policy"] != "fcfs":
        return None
    what = "ITL budget" if flag == "--itl-budget-ms" else "ITL-during-prefill ratio"
    return (
        f"{flag} {value:g} has no effect: the scheduler policy is fcfs, and the {what} "
        f"only sizes the slo policy's steps. Fix: add --scheduler-policy slo, or drop {flag}"
    )


def serve_settings(recipe_or_artifact: str, artifact_root: str) -> tuple[Path, dict, str]:
    """The artifact, the LLM's runtime settings (``prefix_caching``, ``scheduler_policy``,
    ``tpot_budget_ms``, ``itl_budget_ms``, ``itl_during_prefill_ratio``, ``speculative``) and where they came from: a recipe's
    ``runtime.prefix_caching``, ``scheduler`` and ``speculative`` sections; an artifact folder's defaults. Raises TrtpipeError (CLI exit 2)."""
    from trtpipe.pipeline.artifact.locate import artifact_for_recipe, load_recipe_for_deploy, resolve_artifact

    p = Path(recipe_or_artifact)
    if p.is_dir() and (p / "manifest.json").is_file():
        return (
            p,
            {
                "prefix_caching": True,
                "scheduler_policy": "slo",
                "tpot_budget_ms": None,
                "itl_budget_ms": None,
                "itl_during_prefill_ratio": None,
                "speculative": None,
            },
            "the defaults (an artifact folder, no recipe)",
        )
    if p.is_dir():
        return resolve_artifact(recipe_or_artifact, artifact_root), {}, ""  # raises "not an artifact"
    r = load_recipe_for_deploy(recipe_or_artifact)
    settings = {
        "prefix_caching": r.runtime.prefix_caching,
        "scheduler_policy": r.runtime.scheduler.policy,
        "tpot_budget_ms": r.runtime.scheduler.tpot_budget_ms,
        "itl_budget_ms": r.runtime.scheduler.itl_budget_ms,
        "itl_during_prefill_ratio": r.runtime.scheduler.itl_during_prefill_ratio,
        "speculative": r.runtime.spec_config(),
    }
    return artifact_for_recipe(r, artifact_root), settings, f"recipe {r.name!r} (its runtime section)"
