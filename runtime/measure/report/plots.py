"""The validate report's PNG plots (matplotlib, Agg canvas; imported only when plotting).

    ttft_vs_prompt_len.png  one panel per scenario: TTFT (queueing included) against prompt
                            length, with that scenario's TTFT budgets only
    tpot_cdf.png            one panel per scenario: CDF of per-request TPOT on a log time axis,
                            with that scenario's TPOT budgets only
    itl_cdf.png             the same for inter-token latency (all token gaps): on a log axis one
                            2 s stall does not flatten the 15 ms body of the distribution
    kv_occupancy.png        one line: KV blocks used over the whole run (scenarios end to end,
                            boundaries marked), against one pool-capacity line; the y axis is
                            scaled to the peak, with a right axis in % of the pool, and the
                            capacity is named at the top edge when it lies above the panel

matplotlib is an optional dependency of the runtime (the ``plots`` extra; the ``build`` extra
includes it): :func:`plots_available` says whether it is installed, and the report writer skips
the plots with a one-line notice when it is not.
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.runtime.measure.report.records import ScenarioReport

PANEL_HEIGHT_IN = 2.6
WIDTH_IN = 7.5
MISSING_NOTICE = (
    "plots skipped: matplotlib is not installed (the runtime does not need it). "
    "Fix: pip install 'trtpipe[plots]' and rerun validate."
)


def plots_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _figure(title: str, num_panels: int):
    """A Figure on an Agg canvas with ``num_panels`` stacked axes (no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = max(num_panels, 1)
    fig = Figure(figsize=(WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * n), dpi=100)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(n, 1, i + 1) for i in range(n)]
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    return fig, axes


def _png(fig) -> bytes:
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _no_data(ax, what: str = "no data") -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)


def _budget_lines(ax, scen: ScenarioReport, metric: str, *, vertical: bool) -> None:
    """This scenario's budgets on ``metric`` (and only them) as dashed red lines."""
    for r in scen.budget_results:
        if r.metric == metric:
            (ax.axvline if vertical else ax.axhline)(
                r.limit, color="C3", linestyle="--", linewidth=1.2, label=f"budget: {r.label} <= {r.limit:g} ms"
            )


def plot_ttft_vs_prompt(scenarios: Sequence[ScenarioReport]) -> bytes:
    fig, axes = _figure("TTFT vs prompt length (TTFT from arrival: queueing included)", len(scenarios))
    for i, (ax, s) in enumerate(zip(axes, scenarios)):
        pts = [(m.prompt_tokens, m.ttft_s * 1000.0) for m in s.requests if m.ttft_s is not None]
        ax.set_title(s.name, fontsize="medium", loc="left")
        ax.set_ylabel("TTFT (ms)")
        if pts:
            ax.scatter(
                [p for p, _ in pts], [t for _, t in pts], s=12, color=f"C{i % 10}", label=f"requests (n={len(pts)})"
            )
        else:
            _no_data(ax)
        _budget_lines(ax, s, "ttft_ms", vertical=False)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("prompt tokens")
    return _png(fig)


def plot_latency_cdf(scenarios: Sequence[ScenarioReport], which: str) -> bytes:
    """``which``: "tpot" (per request) or "itl" (every token gap). Log x axis (ms)."""
    name = which.upper()
    unit = "requests" if which == "tpot" else "token gaps"
    fig, axes = _figure(f"{name} CDF (log time axis, the same on every panel)", len(scenarios))
    lo, hi = _log_range(scenarios, which)
    for i, (ax, s) in enumerate(zip(axes, scenarios)):
        values = (
            [m.tpot_s for m in s.requests if m.tpot_s is not None]
            if which == "tpot"
            else [g for m in s.requests for g in m.itl_s]
        )
        xs = sorted(v * 1000.0 for v in values if v > 0)  # a log axis has no 0
        ax.set_title(s.name, fontsize="medium", loc="left")
        ax.set_ylabel(f"fraction of {unit}")
        ax.set_xscale("log")
        _log_ms_axis(ax, lo, hi)
        if xs:
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            # start the empirical CDF at 0 so its first jump is visible
            ax.step(
                [xs[0], *xs],
                [0.0, *ys],
                where="post",
                color=f"C{i % 10}",
                label=f"{name} (n={len(xs)}, max {xs[-1]:.4g} ms)",
            )
        else:
            _no_data(ax, f"no {name} data (every request produced one token)" if which == "tpot" else "no data")
        _budget_lines(ax, s, f"{which}_ms", vertical=True)
        ax.set_ylim(0.0, 1.02)
    axes[-1].set_xlabel(f"{name} (ms, log scale)")
    return _png(fig)


def _log_range(scenarios: Sequence[ScenarioReport], which: str) -> tuple[float, float]:
    """x limits (ms) covering every panel's values and budgets, so panels compare by eye."""
    xs = [
        v * 1000.0
        for s in scenarios
        for m in s.requests
        for v in (([m.tpot_s] if m.tpot_s is not None else []) if which == "tpot" else m.itl_s)
        if v > 0
    ]
    xs += [r.limit for s in scenarios for r in s.budget_results if r.metric == f"{which}_ms" and r.limit > 0]
    if not xs:
        return 1.0, 100.0
    return min(xs) / 1.3, max(xs) * 1.3


def _log_ms_axis(ax, lo: float, hi: float) -> None:
    """Log x axis from ``lo`` to ``hi`` ms with plain tick labels at 1-2-5 steps."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _occupancy_series(scenarios: Sequence[ScenarioReport], gap_s: float = 0.0):
    """Scenarios laid end to end: (times, blocks, [(start_s, name)])."""
    ts: list[float] = []
    ns: list[int] = []
    starts: list[tuple[float, str]] = []
    offset = 0.0
    for s in scenarios:
        occ = s.summary.kv_occupancy
        if not occ:
            continue
        t0 = occ[0][0]
        starts.append((offset, s.name))
        ts += [offset + t - t0 for t, _ in occ]
        ns += [n for _, n in occ]
        offset = ts[-1] + gap_s
    return ts, ns, starts


def plot_kv_occupancy(scenarios: Sequence[ScenarioReport]) -> bytes:
    ts, ns, starts = _occupancy_series(scenarios)
    caps = {s.summary.num_kv_blocks for s in scenarios if s.summary.num_kv_blocks}
    capacity = max(caps) if caps else None  # one pool per artifact: every scenario reports it
    peak = max(ns) if ns else 0
    title = "KV pool occupancy"
    if capacity:
        title += f" (peak {peak} of {capacity} blocks, {100.0 * peak / capacity:.1f} %)"
    fig, (ax,) = _figure(title, 1)
    ax.set_xlabel("time since the first step of the run (s); scenarios end to end")
    ax.set_ylabel("KV blocks used")
    if not ns:
        _no_data(ax)
        return _png(fig)
    ax.step(ts, ns, where="post", color="C0", label="blocks used")
    top = max(peak * 1.25, 1.0)
    if capacity and capacity <= top:
        ax.axhline(capacity, color="C3", linestyle="--", linewidth=1.2, label=f"pool capacity {capacity} blocks")
        top = capacity * 1.05
    elif capacity:  # named in the legend; drawing it would squash the line into the bottom strip
        ax.plot(
            [],
            [],
            color="C3",
            linestyle="--",
            linewidth=1.2,
            label=f"pool capacity {capacity} blocks = 100 % (above this panel)",
        )
    ax.set_ylim(0, top)
    for x, name in starts:
        ax.axvline(x, color="0.5", linewidth=0.8, linestyle=":")
        ax.annotate(
            name,
            xy=(x, 0.97),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            va="top",
            fontsize="small",
            color="0.3",
        )
    if capacity:
        to_pct: Callable[[float], float] = lambda b: 100.0 * b / capacity  # noqa: E731
        ax.secondary_yaxis("right", functions=(to_pct, lambda p: p * capacity / 100.0)).set_ylabel("% of pool")
    return _png(fig)


__all__ = ["MISSING_NOTICE", "plot_kv_occupancy", "plot_latency_cdf", "plot_ttft_vs_prompt", "plots_available"]
