"""bench/serve.py, the plot: goodput and TTFT p95 against the offered rate, one line per server,
one column per client (matplotlib, Agg backend), written beside docs/serving.md."""

from __future__ import annotations

import math
from pathlib import Path

from serve_anchors_report import LABELS


def series(raw: dict, client: str, server: str, key: str) -> tuple[list[float], list[float]]:
    """(rates, values) of one figure for one server and client, runs without figures left out; an
    infinite value (a TTFT p95 with > 5 % of the requests unanswered) is left out too."""
    xs, ys = [], []
    for rate in raw["plan"]["rates"]:
        for r in raw["runs"]:
            v = (r.get("figures") or {}).get(key)
            if r["engine"] == server and r.get("client") == client and r["load"].get("rate") == rate:
                if v is not None and not math.isinf(v):
                    xs.append(rate)
                    ys.append(v)
    return xs, ys


def plot(raw: dict, out: Path) -> str | None:
    """Write the PNG to ``out``; its path, or None when matplotlib is missing (the report says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no plot (pip install matplotlib into the project venv)")
        return None
    clients = raw["meta"]["clients"]
    fig, axes = plt.subplots(2, len(clients), figsize=(5.5 * len(clients), 7), squeeze=False)
    for j, c in enumerate(clients):
        for e in raw["meta"]["servers"]:
            axes[0][j].plot(*series(raw, c, e, "goodput_rps"), marker="o", label=LABELS[e])
            axes[1][j].plot(*series(raw, c, e, "ttft_p95_ms"), marker="o", label=LABELS[e])
        rates = raw["plan"]["rates"]
        axes[0][j].plot(rates, rates, color="grey", linestyle=":", label="offered rate")
        axes[0][j].set(title=f"client: {c}", ylabel="goodput (req/s)")
        axes[1][j].axhline(raw["meta"]["slo"]["ttft_ms"], color="grey", linestyle=":", label="TTFT SLO")
        axes[1][j].set(xlabel="offered rate (req/s, Poisson)", ylabel="TTFT p95 over sent (ms)", yscale="log")
        for ax in (axes[0][j], axes[1][j]):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{raw['meta']['machine'].get('cpu')}, {raw['meta']['date']}", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return str(out)
