"""docs/serving.md from bench/serve.py's raw results. Format 2 (servers x clients x rates, the
anchors' comparison of issue 27) is rendered by bench/serve_anchors_report.py; this module renders
the earlier format (trtpipe vs llama-cpp-python's server under aiperf, one aiperf summary per run),
so ``--from-json`` still re-renders a docs/serving.json written before the anchors.

Format 1's figures are aiperf's own (docs/metrics_reference.md of aiperf): ``time_to_first_token``
= request sent -> first response chunk with content; ``inter_token_latency`` = per request,
(request_latency - TTFT) / (output tokens - 1), its percentiles taken over requests;
``output_token_throughput`` = all output tokens / benchmark duration; ``goodput`` = requests per
second whose own values meet every ``--goodput`` constraint.
"""

from __future__ import annotations

from pathlib import Path

import md_analysis
from md_analysis import ANALYSIS_END, analysis_begin

ANALYSIS_BEGIN = analysis_begin("bench/serve.py")
LABELS = {"trtpipe": "trtpipe serve", "llama.cpp": "llama.cpp server (llama-cpp-python)"}


def _stat(m: dict, name: str, stat: str):
    return (m.get(name) or {}).get(stat)


def goodput(m: dict) -> str:
    g = _stat(m, "goodput", "avg")
    return "n/a" if g is None else f"{g:.2f} req/s"


def errors(m: dict) -> int:
    """Failed requests: the counts of aiperf's ``error_summary`` (a list of {error_details, count})."""
    es = m.get("error_summary") or []
    return sum(int(e.get("count", 0)) for e in es if isinstance(e, dict)) if isinstance(es, list) else 0


def slo_met(m: dict, slo: dict) -> bool | None:
    ttft, tpot = _stat(m, "time_to_first_token", "p95"), _stat(m, "inter_token_latency", "p90")
    if ttft is None or tpot is None:
        return None
    return ttft <= slo["ttft_p95_ms"] and tpot <= slo["tpot_p90_ms"]


def read_analysis(doc: Path) -> str:
    """The kept analysis block of docs/serving.md (:func:`md_analysis.read_analysis`)."""
    return md_analysis.read_analysis(doc, ANALYSIS_BEGIN)


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _f(x, digits: int = 0) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _ratio(a, b) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


COLUMNS = (  # (header, metric, stat, digits)
    ("TTFT p50", "time_to_first_token", "p50", 0),
    ("TTFT p95", "time_to_first_token", "p95", 0),
    ("TTFT p99", "time_to_first_token", "p99", 0),
    ("ITL p50", "inter_token_latency", "p50", 1),
    ("ITL p95", "inter_token_latency", "p95", 1),
    ("ITL p99", "inter_token_latency", "p99", 1),
    ("output tok/s", "output_token_throughput", "avg", 1),
    ("req/s done", "request_throughput", "avg", 2),
    ("goodput req/s", "goodput", "avg", 2),
)


def _results_table(raw: dict) -> list[str]:
    meta, runs = raw["meta"], raw["runs"]
    engines = meta["engines"]
    mfl = meta.get("max_foreign_load", 0.3)
    L = [
        "| rate (req/s) | server | " + " | ".join(c[0] for c in COLUMNS) + " | SLO met | done | errors | other load |",
        "|---|---|" + "---|" * len(COLUMNS) + "---|---|---|---|",
    ]
    sent = meta["requests_per_rate"]
    for rate in raw["plan"]["rates"]:
        by = {r["engine"]: r for r in runs if r.get("load", {}).get("rate") == rate}
        for e in engines:
            r = by.get(e)
            if r is None or "error" in r:
                why = "not run" if r is None else r["error"][:160].replace("|", "/")
                L.append(f"| {rate:g} | {LABELS[e]} | " + " | ".join("—" for _ in COLUMNS) + f" | — | — | {why} | |")
                continue
            m = r["metrics"]
            met = slo_met(m, meta["slo"])
            errs = errors(m)
            done = int(_stat(m, "completed_request_count", "avg") or _stat(m, "request_count", "avg") or 0)
            fl = r.get("foreign_load_cores")
            noisy = fl is not None and fl > mfl
            L.append(
                f"| {rate:g} | {LABELS[e]} | "
                + " | ".join(_f(_stat(m, c[1], c[2]), c[3]) for c in COLUMNS)
                + f" | {'—' if met is None else ('yes' if met else 'no')} | {done}/{sent} | {errs} | "
                + f"{'**' if noisy else ''}{fl} cores{' (noisy)**' if noisy else ''} |"
            )
        if len(engines) == 2 and all(e in by and "metrics" in by[e] for e in engines):
            a, b = by[engines[0]]["metrics"], by[engines[1]]["metrics"]
            L.append(
                f"| {rate:g} | *{engines[0]} / {engines[1]}* | "
                + " | ".join(_ratio(_stat(a, c[1], c[2]), _stat(b, c[1], c[2])) for c in COLUMNS)
                + " | | | | |"
            )
    return L


def _goodput_summary(raw: dict) -> list[str]:
    meta, runs = raw["meta"], raw["runs"]
    L = []
    best = {}
    for e in meta["engines"]:
        ok = [
            r["load"]["rate"]
            for r in runs
            if r["engine"] == e and "metrics" in r and slo_met(r["metrics"], meta["slo"])
        ]
        best[e] = max(ok) if ok else None
        peak = max(
            (_stat(r["metrics"], "goodput", "avg") or 0 for r in runs if r["engine"] == e and "metrics" in r),
            default=None,
        )
        L.append(
            f"- {LABELS[e]}: highest measured rate with TTFT p95 <= {meta['slo']['ttft_p95_ms']:g} ms and TPOT "
            f"p90 <= {meta['slo']['tpot_p90_ms']:g} ms: **{'none' if best[e] is None else f'{best[e]:g} req/s'}**"
            f"; peak aiperf goodput (requests meeting both budgets, per second): "
            f"**{_f(peak, 2)} req/s**."
        )
    return L


def _noise(raw: dict) -> list[str]:
    meta, runs = raw["meta"], raw["runs"]
    mi = meta["machine"]
    L = [
        f"- CPU: {mi.get('cpu')} ({mi.get('cpus')} cores, {mi.get('hypervisor') or 'bare metal'} guest; "
        f"{mi.get('simd')}), {mi.get('mem_gib')} GiB; {mi.get('platform')}",
        "- Load average (1/5/15 min) at start: "
        + " / ".join(f"{x:.2f}" for x in mi["loadavg_start"])
        + ", at the end: "
        + " / ".join(f"{x:.2f}" for x in mi["loadavg_end"])
        + ".",
        "- Per run: the cores the server used, the cores aiperf (the client, on the same 2 cores) used, and the "
        "cores every other process used meanwhile (foreign load = machine busy time - server - client; "
        "0 = the machine was ours):",
        "",
        "| run | when (UTC) | server cores | client cores | foreign cores | wall (s) | server start (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in list(raw["plan"].get("probe", {}).values()) + runs:
        if "wall_s" not in r:
            continue
        what = f"probe c={r['load']['concurrency']}" if "concurrency" in r["load"] else f"{r['load']['rate']:g} req/s"
        L.append(
            f"| {r['engine']} {what} | {r.get('when', '')} | {r['server_cpu_cores']} | {r['client_cpu_cores']} | "
            f"{r['foreign_load_cores']} | {r['wall_s']} | {r.get('server_load_s', '—')} |"
        )
    return L


def _intro(meta: dict) -> list[str]:
    L = ["# Serving: `trtpipe serve` vs llama.cpp's OpenAI server, driven by aiperf\n"]
    if meta.get("note"):
        L.append(f"> **{meta['note']}**\n")
    L.append(
        f"Written by `{meta['command']}` on {meta['date']} ({meta['wall_s'] / 60:.1f} min). Re-render from the raw "
        f"results without measuring: `python bench/serve.py --from-json {meta.get('raw_json', 'docs/serving.json')}`; "
        "the analysis section below is kept across runs.\n"
    )
    L.append("Run it (on a quiet machine: the servers and the client share its cores):\n")
    L.append(
        "```bash\n. .venv/bin/activate                   # the project venv, with the serve extra: "
        'pip install -e ".[serve]"\n'
        "python bench/serve.py --setup          # once: llama-cpp-python[server] into .venv-bench (10-20 min "
        "build), aiperf into .venv-bench-aiperf\n"
        "python bench/serve.py                  # probe, 3 rates x 2 servers interleaved (~15 min), rewrites "
        "this file\n```\n"
    )
    L.append("## Results\n")
    L.append(
        f"Streaming chat completions, Poisson arrivals, {meta['requests_per_rate']} measured requests per server and "
        f"rate (after {meta['warmup_requests']} warm-up requests). TTFT and ITL in ms, measured by aiperf at the "
        "client. ITL is aiperf's `inter_token_latency`: per request (latency - TTFT) / (output tokens - 1), i.e. "
        "that request's TPOT; its percentiles are over requests. Goodput: requests per second whose own TTFT <= "
        f"{meta['slo']['ttft_p95_ms']:g} ms and ITL <= {meta['slo']['tpot_p90_ms']:g} ms (aiperf `--goodput`). "
        f"SLO met: TTFT p95 <= {meta['slo']['ttft_p95_ms']:g} ms and ITL p90 <= {meta['slo']['tpot_p90_ms']:g} ms "
        "at that rate. Done: requests completed of those sent (a request still running when the run's "
        f"--duration ({meta.get('duration_s', 0):g} s) plus aiperf's 30 s grace period ends is not counted, "
        "nor in any statistic). Ratio rows: trtpipe / llama.cpp (latency < 1 and throughput > 1 favour trtpipe). Other "
        "load: cores that other processes used during the run (more than "
        f"{meta.get('max_foreign_load', 0.3):g}: noisy; see Machine and noise).\n"
    )
    return L


def _how_run(raw: dict) -> list[str]:
    meta, plan = raw["meta"], raw["plan"]
    w, v = meta["workload"], meta["versions"]
    L = ["## How it was run\n"]
    L.append(
        f"- Servers, one at a time, each started fresh for every run on 127.0.0.1 and stopped after it, "
        f"{meta['threads']} threads each:"
    )
    for e in meta["engines"]:
        cmd = next((r["server_cmd"] for r in raw["runs"] if r["engine"] == e and "server_cmd" in r), None)
        L.append(f"  - {LABELS[e]}: `{' '.join(cmd) if cmd else '(not started)'}`")
    L.append(
        f"- trtpipe: `{v.get('trtpipe_executable')}` ({v.get('trtpipe_checkout', 'checkout unknown')}), artifact "
        f"`{v.get('artifact')}` (recipe {v.get('recipe')}, built {v.get('artifact_built')}); llama-cpp-python "
        f"{v.get('llama-cpp-python')}; aiperf {v.get('aiperf')}."
    )
    L.append(
        f"- Workload (the same file for both servers): {w['num_requests']} chat requests, one user message each, "
        f"windows of a fixed English text of {meta.get('prompt_tokens', [32, 128])[0]}-"
        f"{meta.get('prompt_tokens', [32, 128])[1]} tokens (mean {w['prompt_tokens_mean']:.0f}; the servers add "
        "the chat template, including SmolLM2's default system prompt), each asking for 16-48 output tokens "
        f"(mean {w['output_tokens_mean']:.1f}), seed {w['seed']}; end of sequence suppressed (trtpipe "
        "`ignore_eos`, llama.cpp `logit_bias` -100 on <|im_end|>) so both return exactly that many; temperature 0."
    )
    probe = plan.get("probe") or {}
    if probe:
        caps = ", ".join(
            f"{e} {_f(_stat(r['metrics'], 'request_throughput', 'avg'), 2)} req/s"
            if "metrics" in r
            else f"{e} failed ({r['error'][:100]})"
            for e, r in probe.items()
        )
        L.append(
            f"- Rates from a capacity probe (each server under {next(iter(probe.values()))['load']['concurrency']} "
            f"concurrent requests): {caps}; rates = 0.5 x and 1 x the slower server's capacity, 1 x the faster "
            f"one's: {', '.join(f'{r:g}' for r in plan['rates'])} req/s."
        )
    else:
        L.append(f"- Rates given on the command line: {', '.join(f'{r:g}' for r in plan['rates'])} req/s.")
    L.append(
        "- Interleaved: for each rate, both servers back to back, the order rotating from rate to rate, so "
        "drift of the shared machine hits both."
    )
    example = next((r["aiperf_cmd"] for r in raw["runs"] if "aiperf_cmd" in r), None)
    if example:
        L.append(f"- aiperf command (one run): `{' '.join(example)}`")
    return L + [""]


def _setup_table(meta: dict) -> list[str]:
    L = ["## Setup (`python bench/serve.py --setup`)\n"]
    L.append("| step | venv | result | seconds | when |")
    L.append("|---|---|---|---|---|")
    for k, s in meta.get("setup", {}).items():
        res = ("ok" + (f" ({s['note']})" if s.get("note") else "")) if s.get("ok") else "FAILED: " + str(s.get("error"))
        L.append(f"| {k} | {s.get('venv')} | {res} | {s.get('seconds')} | {s.get('when', '')} |")
    return L + [""]


def render(raw: dict, analysis: str) -> str:
    """docs/serving.md: the results per rate, goodput, the kept ``analysis``, how it was run,
    machine and noise, and the setup record. Raw results of the anchors' comparison (``format``
    2: servers x clients) are rendered by bench/serve_anchors_report.py."""
    if raw.get("format") == 2:
        import serve_anchors_report

        return serve_anchors_report.render(raw, analysis, ANALYSIS_BEGIN)
    kept = [
        ANALYSIS_BEGIN,
        analysis.strip("\n") if analysis.strip() else "## Analysis\n\n(not written yet)",
        ANALYSIS_END + "\n",
    ]
    L = (
        _intro(raw["meta"])
        + _results_table(raw)
        + [""]
        + _goodput_summary(raw)
        + [""]
        + kept
        + _how_run(raw)
        + ["## Machine and noise\n"]
        + _noise(raw)
        + [""]
        + _setup_table(raw["meta"])
    )
    return "\n".join(L)
