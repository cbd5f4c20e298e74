"""``trtpipe validate RECIPE --url URL`` (or ``--serve``): the recipe's scenarios against a running
``trtpipe serve``, measured at the client through streaming HTTP.

    recipe ──► scenarios ──► make_workload (tokenized by the server's /tokenize)
           ──► run_workload_http (runtime/measure/http_client.py: TTFT = request sent -> first
               non-empty text chunk; TPOT/ITL from chunk arrival times)
           ──► summarize ─► evaluate_budgets ─► the same report, plots and gate as in-process
               (written to <artifact>/validate/http/...; ``env.measured_by`` says how)

Correctness against the golden outputs needs the engine's logits, so it runs in-process only
(``trtpipe validate RECIPE``); over HTTP it is "not checked" and does not affect the gate. The KV
leak check reads ``trtpipe:kv_blocks_in_use`` from the server's ``/metrics`` after each scenario.
``--serve`` starts ``trtpipe serve`` on a free loopback port for the run and stops it afterwards.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.validate.runner import (
    ValidateUsageError,
    finish_report,
    gate_of_reports,
    load_recipe_for_validate,
    print_scenario,
    report_dir,
    scenario_workload_spec,
    select_scenarios,
)
from trtpipe.pipeline.validate.scenario import run_scenario

MEASURED_BY = (
    "client over HTTP: streamed POST /v1/completions; TTFT = request sent -> first non-empty text "
    "chunk; TPOT and ITL from chunk arrival times (network, HTTP and SSE included)"
)


def serve_command(artifact_dir: Path, port: int, threads: int | None, recipe: Recipe | None = None) -> list[str]:
    """The ``trtpipe serve ARTIFACT`` command line ``--serve`` runs, with ``recipe``'s runtime
    settings (runtime.prefix_caching, runtime.scheduler.*, runtime.speculative) as flags: the
    artifact folder alone gets the server's defaults (the ``slo`` policy under the TPOT and ITL
    budgets it derives from the engine's step-cost model, :mod:`trtpipe.runtime.sched.serving_budgets`),
    not the recipe's settings."""
    cmd = [sys.executable, "-m", "trtpipe.pipeline.cli.main", "serve", str(artifact_dir), "--port", str(port)]
    if threads:
        cmd += ["--threads", str(threads)]
    if recipe is not None:
        sched = recipe.runtime.scheduler
        cmd += [] if recipe.runtime.prefix_caching else ["--no-prefix-caching"]
        cmd += ["--scheduler-policy", sched.policy]
        if sched.tpot_budget_ms is not None:
            cmd += ["--tpot-budget-ms", repr(sched.tpot_budget_ms)]
        if sched.itl_budget_ms is not None and sched.policy == "slo":  # serve refuses it under fcfs
            cmd += ["--itl-budget-ms", repr(sched.itl_budget_ms)]
        if sched.itl_during_prefill_ratio is not None and sched.policy == "slo":
            cmd += ["--itl-during-prefill-ratio", repr(sched.itl_during_prefill_ratio)]
        spec = recipe.runtime.speculative
        if spec is not None:
            cmd += ["--speculative", spec.method, "--speculative-max-k", str(spec.max_k)]
            cmd += ["--speculative-ngram", str(spec.min_n), str(spec.max_n)]
    return cmd


@contextmanager
def served(
    artifact_dir: Path,
    threads: int | None,
    ready_timeout_s: float = 300.0,
    recipe: Recipe | None = None,
    echo: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """``trtpipe serve ARTIFACT`` (:func:`serve_command`) on a free 127.0.0.1 port; yields its
    URL; always stopped. ``echo`` gets the server's start line that names its scheduler and
    prefill chunks (what the run measures)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = serve_command(artifact_dir, port, threads, recipe)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not any("ready at" in line for line in lines):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ValidateUsageError(f"--serve: `{' '.join(cmd)}` did not become ready:\n{''.join(lines)[-2000:]}")
            time.sleep(0.05)
        if echo is not None:
            for line in [x for x in lines if "prefill chunks:" in x]:
                echo(line.rstrip())
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def server_base_url(url: str) -> str:
    """``--url`` as the server's root: ``http(s)://host:port`` without a final ``/`` or ``/v1``
    (the OpenAI ``base_url`` a user copies from the README works too). Raises
    :class:`ValidateUsageError` for a URL without an http:// or https:// scheme or with a port
    outside 0-65535."""
    from urllib.parse import urlsplit

    base = url.strip().rstrip("/")
    if not base.lower().startswith(("http://", "https://")):
        raise ValidateUsageError(
            f"--url {url!r}: expected an http:// or https:// URL of a `trtpipe serve`. "
            "Fix: pass e.g. --url http://127.0.0.1:8000"
        )
    try:
        urlsplit(base).port  # noqa: B018 - raises for a port outside 0-65535 or not a number
    except ValueError as e:
        raise ValidateUsageError(
            f"--url {url!r}: {e}. Fix: pass the port `trtpipe serve` listens on, e.g. --url http://127.0.0.1:8000"
        ) from None
    return base[:-3] if base.endswith("/v1") else base


def _serve_command(url: str, recipe: Recipe) -> str:
    """``trtpipe serve RECIPE`` listening where ``url`` points (--host/--port when not the defaults)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    cmd = f"trtpipe serve {recipe.name}"
    if parts.hostname and parts.hostname != "127.0.0.1":
        cmd += f" --host {parts.hostname}"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return cmd + (f" --port {port}" if port != 8000 else "")


_MODELS_FIX = {
    401: "pass the server's --api-key",
    403: "pass the server's --api-key",
    404: "this is not an OpenAI-compatible server (no /v1/models): check the host and port of --url",
    503: "the server is still loading: wait until its /health answers 200",
}


def _served_model(url: str, recipe: Recipe, headers: dict[str, str]) -> str:
    import httpx

    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise ValidateUsageError(
            f"--url {url}: cannot reach the server ({e}). Fix: start it with "
            f"`{_serve_command(url, recipe)}` or pass --serve."
        ) from None
    body = " ".join(r.text.split())
    body = body if len(body) <= 200 else body[:200] + " ..."
    try:
        doc = r.json() if r.status_code == 200 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        fix = _MODELS_FIX.get(r.status_code, "check that --url is a `trtpipe serve` (an OpenAI-compatible server)")
        raise ValidateUsageError(
            f"--url {url}: GET /v1/models answered HTTP {r.status_code}"
            f"{' without a JSON model list' if r.status_code == 200 else ''} ({body}). Fix: {fix}."
        )
    names = [m.get("id") for m in doc.get("data", []) if isinstance(m, dict)]
    if recipe.name not in names:
        raise ValidateUsageError(
            f"--url {url} serves {names}, not recipe {recipe.name!r}. Fix: validate the "
            "recipe the server was started with, or start `trtpipe serve` for this one."
        )
    return recipe.name


def _local_chat_template(artifact_dir: Path) -> str | None:
    """The model's chat template from the artifact's manifest when it is on this machine (chat
    workloads render prompts client-side); None when the client has no copy of the artifact."""
    from trtpipe.runtime.artifact.manifest import load_manifest
    from trtpipe.runtime.errors import ArtifactError

    try:
        return load_manifest(artifact_dir).model.chat_template
    except ArtifactError:
        return None


def http_probe(base: str, model: str, api_key: str | None, limits: tuple[int, int]):
    """The engine probes (``cancel_ms``, ``itl_during_prefill_ratio``) against the server at ``base``;
    ``limits``: its (max_batch_size, max_seq_len), from the local artifact when there is one."""
    from trtpipe.runtime.measure.probe_clients import HttpProbeClient, measure_engine_probes

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def probe(short_ids, long_ids, *, cancel: bool, itl: bool):
        make = lambda: HttpProbeClient(base, model, headers)  # noqa: E731 - built inside the probe's event loop
        return measure_engine_probes(make, short_ids, long_ids, *limits, cancel=cancel, itl=itl)

    return probe


ASSUMED_SERVER_LIMITS = (16, 2048)  # (max_batch_size, max_seq_len) the probes assume without a local artifact


def _server_limits(artifact_dir: Path, err) -> tuple[int, int]:
    """(max_batch_size, max_seq_len) of the local copy of the artifact; without one,
    :data:`ASSUMED_SERVER_LIMITS` (the cancel probe then starts 20 requests: a full batch on most
    servers), said in one line on ``err`` with how to give the real ones (``--artifact DIR``)."""
    from trtpipe.runtime.artifact.manifest import load_manifest
    from trtpipe.runtime.errors import ArtifactError

    try:
        limits = load_manifest(artifact_dir, verify_hashes=False).limits
    except ArtifactError:
        batch, seq = ASSUMED_SERVER_LIMITS
        err.print(
            f"engine probes: no artifact manifest at {artifact_dir}, so they assume the server's "
            f"max_batch_size = {batch} and max_seq_len = {seq}; pass --artifact DIR (a local copy of the "
            "served artifact) for its real limits",
            markup=False,
        )
        return batch, seq
    return limits.max_batch_size, limits.max_seq_len


def _run_scenarios(
    base: str, model: str, specs: list, api_key: str | None, tokenizer, chat_template: str | None, out, err, art: Path
) -> list:
    """Run each (scenario, workload spec) against the server at ``base`` in order, printing each
    scenario's table as it finishes; returns their ScenarioReports."""
    from trtpipe.runtime.measure.http_client import run_workload_http

    reports = []
    probe = http_probe(base, model, api_key, _server_limits(art, err))
    for scenario, spec in specs:

        def run(items, concurrency, on_request_done):
            return run_workload_http(base, model, items, concurrency, api_key=api_key, on_request_done=on_request_done)

        reports.append(
            run_scenario(
                None, scenario, spec, err, run=run, tokenizer=tokenizer, chat_template=chat_template, probe=probe
            )
        )
        print_scenario(out, reports[-1])
    return reports


def _client_env(base: str, serve: bool) -> dict:
    """The report's ``env`` record: who measured, the server URL, the client machine and its load."""
    return {
        "measured_by": MEASURED_BY,
        "url": base,
        "server": "started by --serve" if serve else "external",
        "client_host": platform.node(),
        "client_platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15m_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def _write_http_report(out_dir: Path, r: Recipe, reports: list, base: str, serve: bool):
    """:func:`~trtpipe.runtime.measure.report.document.write_report` of the HTTP run into ``out_dir`` (correctness is not
    checked over HTTP; env = the client machine); returns its ReportPaths."""
    from trtpipe.runtime.measure.report.document import write_report

    correctness = {
        "method": "not checked over HTTP (needs the engine's logits); run `trtpipe validate "
        f"{r.name}` in-process for the golden-output check"
    }
    return write_report(
        out_dir,
        recipe_name=r.name,
        target=r.target,
        scenarios=reports,
        correctness=correctness,
        env=_client_env(base, serve),
    )


def run_validate_http(
    recipe: str | os.PathLike | Recipe,
    *,
    url: str | None = None,
    serve: bool = False,
    artifact_dir: str | os.PathLike | None = None,
    artifact_root: str | os.PathLike = "artifacts",
    scenarios: Sequence[str] = (),
    as_json: bool = False,
    threads: int | None = None,
    api_key: str | None = None,
    goodput: bool = False,
    goodput_time_s: float = 300.0,
) -> int:
    """Validate over HTTP; returns the gate's exit code (0 pass, 1 fail). Exactly one of ``url``
    and ``serve``. ``goodput``: then search each Poisson scenario's goodput against the same server
    (its own scheduler settings apply: the per-scenario TPOT budget of the in-process search cannot
    be set over HTTP). Raises :class:`ValidateUsageError` (CLI exit 2) for an unreachable server or
    one serving another model."""
    from contextlib import nullcontext

    from trtpipe.pipeline.stages import artifact_dir_for
    from trtpipe.pipeline.validate.output import validate_consoles
    from trtpipe.runtime.measure.http_client import HttpTokenizer

    if (url is None) == (not serve):
        raise ValidateUsageError("pass exactly one of --url URL (a running server) and --serve (start one).")
    url = server_base_url(url) if url is not None else None
    r = load_recipe_for_validate(recipe)
    chosen = select_scenarios(r, list(dict.fromkeys(scenarios)))
    specs = [(s, scenario_workload_spec(r, s)) for s in chosen]
    art = Path(artifact_dir) if artifact_dir is not None else artifact_dir_for(r, artifact_root)
    out, err = validate_consoles(as_json)  # tables (stderr when stdout carries JSON), progress
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    echo = lambda s: err.print(s, markup=False)  # noqa: E731
    with served(art, threads, recipe=r, echo=echo) if serve else nullcontext(url) as base:
        err.print(f"validate {r.name} over HTTP at {base}" + (" (started by --serve)" if serve else ""))
        model = _served_model(base, r, headers)
        tokenizer = HttpTokenizer(base, headers)
        chat_template = _local_chat_template(art)
        reports = _run_scenarios(base, model, specs, api_key, tokenizer, chat_template, out, err, art)
        paths = _write_http_report(report_dir(art, r, chosen) / "http", r, reports, base, serve)

        def search_goodput() -> None:  # while the server is still up (--serve stops it on exit)
            from trtpipe.pipeline.validate.goodput import http_runner, run_goodput

            err.print("goodput over HTTP: the server's own scheduler settings apply to every probe")
            run_goodput(
                http_runner(base, model, tokenizer, chat_template, api_key),
                specs,
                paths.report_json.parent,
                err,
                out,
                time_budget_s=goodput_time_s,
            )

        gate = gate_of_reports(reports, None)  # correctness is not checked over HTTP
        return finish_report(out, err, paths, gate, as_json, then=search_goodput if goodput else None)


__all__ = ["run_validate_http", "served", "MEASURED_BY"]
