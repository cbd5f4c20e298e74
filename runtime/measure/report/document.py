"""Validation report: report.json (versioned), report.md and PNG plots, plus the CLI gate table.

Written under ``artifacts/<recipe>/<target>/validate/`` (see :func:`validate_dir`):

    report.json              schema_version 1: per scenario the summary (``*_ms``), the budget
                             results, every request's metrics; correctness; environment; gate
    report.md                the same, as markdown tables
    ttft_vs_prompt_len.png   TTFT (queueing included) against prompt length, with budget lines
    tpot_cdf.png             CDF of per-request TPOT (requests with >= 2 output tokens)
    itl_cdf.png              CDF of inter-token latency over all tokens
    kv_occupancy.png         KV blocks used over time, with the pool capacity

Every file is written atomically (a temp file in the same directory, then ``os.replace``), so a
reader never sees a half-written report. The plots live in :mod:`trtpipe.runtime.measure.report.plots`;
matplotlib is optional on the runtime side (extra ``plots``): without it the report is written
without plots and ``ReportPaths.notice`` says so in one line.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.measure.budgets import BudgetResult, gate_exit_code
from trtpipe.runtime.measure.report.markdown import fmt_margin, render_markdown
from trtpipe.runtime.measure.report.records import ScenarioReport
from trtpipe.runtime.metrics.decode_bandwidth import DecodeReadModel, scenario_decode_bandwidth
from trtpipe.runtime.metrics.request_metrics import PERCENTILE_METHOD

SCHEMA_VERSION = 1
"""Version of report.json's layout; bump it when a field changes meaning or moves."""

PLOT_FILES: tuple[str, ...] = ("ttft_vs_prompt_len.png", "tpot_cdf.png", "itl_cdf.png", "kv_occupancy.png")


@dataclass(frozen=True)
class ReportPaths:
    """Where :func:`write_report` put each file."""

    report_json: Path
    report_md: Path
    ttft_vs_prompt_len: Path | None  # None: plots skipped (``notice`` says why)
    tpot_cdf: Path | None
    itl_cdf: Path | None
    kv_occupancy: Path | None
    notice: str | None = None

    def plots(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.ttft_vs_prompt_len, self.tpot_cdf, self.itl_cdf, self.kv_occupancy) if p)

    def all(self) -> tuple[Path, ...]:
        return (self.report_json, self.report_md, *self.plots())


def validate_dir(artifacts_root: str | os.PathLike, recipe_name: str, target: str) -> Path:
    """``<artifacts_root>/<recipe>/<target>/validate`` (not created)."""
    return Path(artifacts_root) / recipe_name / target / "validate"


def _as_scenario(item: ScenarioReport | Sequence[Any]) -> ScenarioReport:
    if isinstance(item, ScenarioReport):
        return item
    name, summary, results, requests = item
    return ScenarioReport(str(name), summary, tuple(results), tuple(requests))


def correctness_status(correctness: Mapping[str, Any]) -> bool | None:
    """``correctness["passed"]`` as a bool, or ``None`` when correctness was not checked."""
    passed = correctness.get("passed")
    return None if passed is None else bool(passed)


# -- report.json --------------------------------------------------------------------------------


def build_report(
    *,
    recipe_name: str,
    target: str,
    scenarios: Iterable[ScenarioReport | Sequence[Any]],
    correctness: Mapping[str, Any],
    env: Mapping[str, Any],
    generated_at: str | None = None,
    plots: Sequence[str] = PLOT_FILES,
    decode_read: DecodeReadModel | None = None,
    target_bandwidth_bytes_per_s: float | None = None,
) -> dict:
    """The report.json document (a JSON-ready dict; latencies in ms). ``plots``: the plot files
    written beside it (none when matplotlib is missing). ``decode_read``: the artifact's bytes per
    decode step (:func:`~trtpipe.runtime.metrics.decode_bandwidth.read_model_from_manifest`); with it each
    scenario gets its achieved ``decode_bandwidth`` (at TPOT p50; a share of
    ``target_bandwidth_bytes_per_s`` where known).

    ``correctness`` must carry ``"passed": bool`` when correctness was checked; without it the
    report says "not checked" and correctness does not affect the gate.
    """
    scen = [_as_scenario(s) for s in scenarios]
    all_results = [r for s in scen for r in s.budget_results]
    leaks = [s.summary.kv_leak_free for s in scen if s.summary.kv_leak_free is not None]
    kv_leak_free = all(leaks) if leaks else None
    correct = correctness_status(correctness)
    exit_code = gate_exit_code(all_results, correct is not False, kv_leak_free=kv_leak_free)
    return {
        "schema_version": SCHEMA_VERSION,
        "recipe": recipe_name,
        "target": target,
        "generated_at": generated_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "percentile_method": PERCENTILE_METHOD,
        "gate": {
            "passed": exit_code == 0,
            "exit_code": exit_code,
            "budgets_passed": all(r.passed for r in all_results),
            "correctness_passed": correct,
            "kv_leak_free": kv_leak_free,
        },
        "correctness": dict(correctness),
        "env": dict(env),
        "scenarios": [
            {
                "name": s.name,
                "summary": s.summary.to_dict(),
                "budgets": [r.to_dict() for r in s.budget_results],
                "requests": [m.to_dict() for m in s.requests],
                "decode_bandwidth": _decode_bandwidth(decode_read, s, target_bandwidth_bytes_per_s),
            }
            for s in scen
        ],
        "plots": list(plots),
    }


def _decode_bandwidth(model: DecodeReadModel | None, s: ScenarioReport, peak: float | None) -> dict | None:
    bw = None if model is None else scenario_decode_bandwidth(model, s.summary.to_dict(), peak)
    return None if bw is None else bw.to_dict()


def load_report(path: str | os.PathLike) -> dict:
    """Read a report.json written by :func:`write_report`; refuses another schema version."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"report {path}: cannot read it ({e}); rerun `trtpipe validate`") from e
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"report {path}: schema_version={version!r}, expected {SCHEMA_VERSION}; "
            "rerun `trtpipe validate` with this version of trtpipe"
        )
    return doc


# -- report.md ----------------------------------------------------------------------------------


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, replace."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; a report is meant to be read by others (CI artifact stores).
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_report(
    out_dir: str | os.PathLike,
    *,
    recipe_name: str,
    target: str,
    scenarios: Iterable[ScenarioReport | Sequence[Any]],
    correctness: Mapping[str, Any],
    env: Mapping[str, Any],
    generated_at: str | None = None,
    plots: bool | None = None,
    decode_read: DecodeReadModel | None = None,
    target_bandwidth_bytes_per_s: float | None = None,
) -> ReportPaths:
    """Write report.json, report.md and the four PNG plots into ``out_dir`` (created if needed).

    ``plots``: draw them (None: when matplotlib is installed; without it the paths are None and
    ``notice`` says why, in one line).

    ``scenarios``: :class:`ScenarioReport` items or ``(name, summary, budget_results, requests)``
    tuples. ``correctness``: free-form, with ``"passed": bool`` when it was checked. ``env``:
    JSON-serializable facts about the machine and build (non-JSON values are written as str).
    Returns the paths written.
    """
    from trtpipe.runtime.measure.report import plots as report_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scen = [_as_scenario(s) for s in scenarios]
    draw = report_plots.plots_available() if plots is None else plots
    doc = build_report(
        recipe_name=recipe_name, target=target, scenarios=scen,
        correctness=correctness, env=env, generated_at=generated_at,
        plots=PLOT_FILES if draw else (), decode_read=decode_read,
        target_bandwidth_bytes_per_s=target_bandwidth_bytes_per_s,
    )  # fmt: skip
    # allow_nan=False: NaN/Infinity are not JSON; a NaN here is a bug upstream, so fail loudly.
    text = json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"
    doc = json.loads(text)  # what a reader will see (default=str applied) drives report.md too
    plot = (lambda name: out / name) if draw else (lambda name: None)
    paths = ReportPaths(
        report_json=out / "report.json",
        report_md=out / "report.md",
        ttft_vs_prompt_len=plot("ttft_vs_prompt_len.png"),
        tpot_cdf=plot("tpot_cdf.png"),
        itl_cdf=plot("itl_cdf.png"),
        kv_occupancy=plot("kv_occupancy.png"),
        notice=None if draw else report_plots.MISSING_NOTICE,
    )
    if draw:
        atomic_write_bytes(out / "ttft_vs_prompt_len.png", report_plots.plot_ttft_vs_prompt(scen))
        atomic_write_bytes(out / "tpot_cdf.png", report_plots.plot_latency_cdf(scen, "tpot"))
        atomic_write_bytes(out / "itl_cdf.png", report_plots.plot_latency_cdf(scen, "itl"))
        atomic_write_bytes(out / "kv_occupancy.png", report_plots.plot_kv_occupancy(scen))
    atomic_write_bytes(paths.report_md, render_markdown(doc).encode("utf-8"))
    # report.json last: its presence means the whole report is there.
    atomic_write_bytes(paths.report_json, text.encode("utf-8"))
    return paths


# -- CLI table ----------------------------------------------------------------------------------


def render_rich_table(results: Sequence[BudgetResult], title: str | None = None):
    """A ``rich.table.Table``: budget, limit, measured, margin, pass/fail (one row per budget)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, caption=f"percentiles: {PERCENTILE_METHOD}")
    table.add_column("budget")
    table.add_column("limit", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("margin", justify="right")
    table.add_column("result")
    for r in results:
        op = "≤" if r.kind == "max" else "≥"
        measured = "–" if r.measured is None else f"{r.measured:.2f} {r.unit}"
        result = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        if r.measured is None:
            result += f" ({escape(r.reason)})"
        limit = f"{op} {r.limit:g} {r.unit}"
        table.add_row(r.label, limit, measured, fmt_margin(r.margin), result)
    return table


__all__ = [
    "SCHEMA_VERSION",
    "PLOT_FILES",
    "ReportPaths",
    "ScenarioReport",
    "atomic_write_bytes",
    "build_report",
    "correctness_status",
    "load_report",
    "render_markdown",
    "render_rich_table",
    "validate_dir",
    "write_report",
]
