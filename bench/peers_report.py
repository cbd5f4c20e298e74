"""bench/peers.py, the report: docs/benchmarks.md from the summaries, raw runs, decode profile,
setup record and physical floors. The hand-written analysis block is kept across runs.
"""

from __future__ import annotations

import itertools
import math

from md_analysis import ANALYSIS_END, analysis_begin
from peers_floors import Floors
from peers_measure import median
from peers_setup import ENGINES, OWN_ENGINES
from peers_targets import TARGET_MEMORY_FACTOR, targets
from peers_targets import fmt_ms as _ms
from peers_workload import CONCURRENT_PROMPT_TOKENS, NUM_CONCURRENT, NUM_OUTPUT_TOKENS, PROMPT_LENGTHS

ANALYSIS_BEGIN = analysis_begin("bench/peers.py")


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _fmt_ratio(r):
    return "—" if r is None else f"{r:.2f}x"


def _pct(x):
    return "—" if x is None else f"{x * 100:.0f} %"


def _label(e: str) -> str:
    return ENGINES[e].label


def _header(meta: dict) -> list[str]:
    mfl = meta.get("max_foreign_load")
    L = ["# Benchmarks: trtpipe CPU runtime vs peers (SmolLM2-135M)\n"]
    L.append(
        f"Written by `python bench/peers.py` on {meta['date']}: {meta.get('rounds', meta['repeats'])} "
        f"interleaved rounds, {meta['threads']} threads per engine, {meta['wall_s'] / 60:.1f} min in all. "
        "Medians over each engine's clean runs"
        + (
            f" (runs during which other processes used more than {mfl:g} cores are left out; see the raw numbers)"
            if mfl is not None and mfl != math.inf
            else ""
        )
        + ". Regenerate with the same command; the analysis section below is kept across runs.\n"
    )
    m = meta["machine"]
    L.append("## Machine\n")
    L.append(
        f"- CPU: {m.get('cpu')} (family {m.get('cpu_family')}, model {m.get('cpu_model')}), "
        f"{m.get('cpus')} cores, {m.get('hypervisor') or 'bare metal'} guest; SIMD: {m.get('simd')}"
    )
    L.append(f"- Memory: {m.get('mem_gib')} GiB; {m.get('platform')}; Python {m.get('python')}")
    la = m.get("loadavg_start")
    if la:
        le = m.get("loadavg_end") or la
        L.append(
            f"- Load average (1/5/15 min) at start: {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f}, at the end: "
            f"{le[0]:.2f} / {le[1]:.2f} / {le[2]:.2f}. The cores are shared with other workers: drift is why "
            "the engines are interleaved, and each run's foreign load is in the raw numbers below."
        )
    peaks = meta.get("host_peaks")
    if peaks:
        from host_peaks import HostPeaks

        L.append(
            f"- Peak rates (`bench/host_peaks.py`, ONNX Runtime kernels, {peaks['threads']} threads, before the "
            "rounds; the floors use the read bandwidth and the int8 or fp32 peak):"
        )
        L += [f"  - {line}" for line in HostPeaks(**peaks).lines()]
    return L + [""]


def _engines(summary: dict) -> list[str]:
    L = ["## Engines and versions\n", "| engine | versions | load (s) | runs used | notes |", "|---|---|---|---|---|"]
    for e in ENGINES:
        s = summary.get(e)
        if s is None:
            continue
        if "error" in s:
            L.append(f"| {_label(e)} | — | — | 0 | **not run**: {s['error']} |")
            continue
        v = ", ".join(
            f"{k} {val}" if not str(val).startswith(k) else str(val) for k, val in s["versions"].items() if val
        )
        note = f"{len(s['errors'])} failed run(s): {s['errors'][0]}" if s["errors"] else ""
        if s.get("contended"):
            note = "**no clean run: medians over contended runs** " + note
        L.append(
            f"| {_label(e)} | {v} | {s['load_s']:.1f} | {s['repeats']} of {s.get('runs', s['repeats'])} | {note} |"
        )
    return L + [""]


def _latency_cells(s: dict, fn) -> str:
    return (
        " | ".join(fn("ttft_s", n) for n in PROMPT_LENGTHS)
        + " | "
        + " | ".join(fn("tpot_s", n) for n in PROMPT_LENGTHS)
    )


def _latency(summary: dict, order: list[str], floors: Floors) -> list[str]:
    floor = {"ttft_s": floors.ttft_s, "tpot_s": floors.tpot_s}
    hdr = (
        "| engine | "
        + " | ".join(f"TTFT {n}" for n in PROMPT_LENGTHS)
        + " | "
        + " | ".join(f"TPOT {n}" for n in PROMPT_LENGTHS)
        + " |"
    )
    rule = "|---" * (1 + 2 * len(PROMPT_LENGTHS)) + "|"
    L = [
        "## Latency at batch 1 (medians, ms)\n",
        "TTFT: token ids handed over -> first generated token. TPOT: mean gap between the 64 generated "
        "tokens (EOS ignored). Ratio = trtpipe / peer (< 1: trtpipe faster). % of floor = floor / measured.\n",
        hdr,
        rule,
    ]
    for e in order:
        s = summary[e]
        if "error" in s:
            L.append(f"| {_label(e)} | " + " | ".join(["not run"] * 2 * len(PROMPT_LENGTHS)) + " |")
        else:
            L.append(f"| {_label(e)} | " + _latency_cells(s, lambda k, n: _ms(s[k][n])) + " |")
    L.append("| *physical floor* | " + _latency_cells({}, lambda k, n: _ms(floor[k][n])) + " |")
    for own in OWN_ENGINES:
        t = summary.get(own, {})
        if "error" in t or not t:
            continue
        for e in (e for e in order if e not in OWN_ENGINES and "error" not in summary[e]):
            s = summary[e]
            L.append(
                f"| *{own} / {e}* | "
                + _latency_cells(s, lambda k, n, t=t, s=s: _fmt_ratio(_ratio(t[k][n], s[k][n])))
                + " |"
            )
    L += ["", "% of the physical floor (floor / measured; 100 % = at the floor):\n", hdr, rule]
    for e in order:
        s = summary[e]
        if "error" not in s:
            L.append(f"| {_label(e)} | " + _latency_cells(s, lambda k, n: _pct(_ratio(floor[k][n], s[k][n]))) + " |")
    L.append(f"\nFloors: {floors.describe()}; `bench/peers_floors.py` says how.")
    return L + [""]


HOW = {
    "trtpipe": "continuous batching (`add_request` x8, `step` until done)",
    "trtpipe-fast": "continuous batching (`add_request` x8, `step` until done)",
    "llama.cpp": "sequential (no multi-sequence batch in llama-cpp-python's API)",
    "ortgenai-int4": "one static batch of 8",
    "ortgenai-fp32": "one static batch of 8",
    "openvino-int4-sym": "one static batch of 8 (`LLMPipeline.generate`)",
    "openvino-int4-asym": "one static batch of 8 (`LLMPipeline.generate`)",
    "vllm-bf16": "continuous batching (`llm_engine.add_request` x8, `step` until done)",
    "transformers-fp32": "one static batch of 8 (`generate`)",
}


def _throughput(summary: dict, order: list[str], floors: Floors) -> list[str]:
    t = summary.get("trtpipe", {})
    L = [
        f"## Throughput: {NUM_CONCURRENT} concurrent requests ({CONCURRENT_PROMPT_TOKENS} prompt + "
        f"{NUM_OUTPUT_TOKENS} output tokens each)\n",
        "| engine | how | output tok/s (median) | trtpipe / engine | % of floor |",
        "|---|---|---|---|---|",
    ]
    for e in order:
        s = summary[e]
        if "error" in s:
            L.append(f"| {_label(e)} | {HOW[e]} | not run | — | — |")
            continue
        r = _ratio(t.get("tps"), s["tps"]) if "error" not in t else None
        L.append(
            f"| {_label(e)} | {HOW[e]} | {s['tps']:.0f} | {_fmt_ratio(r) if e not in OWN_ENGINES else '—'} | "
            f"{_pct(s['tps'] / floors.tps)} |"
        )
    L.append(
        f"| *physical floor* | {NUM_CONCURRENT} prefills of {CONCURRENT_PROMPT_TOKENS} tokens + "
        f"{NUM_OUTPUT_TOKENS} batch-{NUM_CONCURRENT} decode steps | {floors.tps:.0f} | | |"
    )
    ex = t.get("extra", {}) if "error" not in t else {}
    if ex.get("concurrent_ttft_s"):
        L.append(
            f"\ntrtpipe's 8 requests in that run (its last run): TTFT median "
            f"{_ms(median(ex['concurrent_ttft_s']))} ms, "
            f"TPOT median {_ms(median(ex['concurrent_tpot_s']))} ms."
        )
    return L + [""]


def _rss_breakdown(t: dict, ex: dict) -> list[str]:
    a, b = ex.get("rss_after_import_bytes"), ex.get("rss_after_load_bytes")
    if not (a and b):
        return []
    L = [
        f"Where the RSS goes (its last run): {a / 2**20:.0f} MiB after the imports (interpreter, numpy, "
        f"onnxruntime); {b / 2**20:.0f} MiB once `LLM(...)` has loaded (+{(b - a) / 2**20:.0f} MiB: the "
        f"prepacked weight copies onnxruntime makes, one per session; the mapped weights.data pages "
        f"are dropped once the sessions exist); "
        f"peak {t['peak_rss_bytes'] / 2**20:.0f} MiB after the runs "
        f"(+{(t['peak_rss_bytes'] - b) / 2**20:.0f}"
        " MiB: activation arenas and the KV blocks actually written; np.zeros pages of the KV pool "
        "that are never written are never resident)."
    ]
    f, an = ex.get("rss_file_end_bytes"), ex.get("rss_anon_end_bytes")
    if f and an:
        L.append(
            f"At the end of the worker {f / 2**20:.0f} MiB of the RSS were file pages (the memory-mapped "
            f"weights.data pages read again and the shared libraries) and {an / 2**20:.0f} MiB private memory "
            "(onnxruntime's prepacked weight copies, its arenas, the KV pool, Python)."
        )
    return L


def _memory(summary: dict, order: list[str]) -> list[str]:
    t = summary.get("trtpipe", {})
    L = ["## Memory (peak resident set of each worker process)\n", "| engine | peak RSS (MiB) |", "|---|---|"]
    L += [f"| {_label(e)} | {summary[e]['peak_rss_bytes'] / 2**20:.0f} |" for e in order if "error" not in summary[e]]
    ex = t.get("extra", {}) if "error" not in t else {}
    if ex.get("weights_bytes"):
        w, k = ex["weights_bytes"], ex["kv_pool_bytes"]
        L.append(
            f"\ntrtpipe: weights.data {w / 2**20:.0f} MiB + KV pool {k / 2**20:.0f} MiB = "
            f"{(w + k) / 2**20:.0f} MiB; "
            f"budget {TARGET_MEMORY_FACTOR}x = {TARGET_MEMORY_FACTOR * (w + k) / 2**20:.0f} MiB; peak RSS {t['peak_rss_bytes'] / 2**20:.0f} MiB "
            f"= {t['peak_rss_bytes'] / (w + k):.2f}x."
        )
        L += _rss_breakdown(t, ex)
    return L + [""]


def _ort_ops(p: dict) -> list[str]:
    o = p.get("ort_ops")
    if not o:
        return []
    L = [
        f"\nInside the graph (onnxruntime's profiler, a separate load; model_run {o['run_ms']:.2f} ms "
        f"per step, {o.get('nodes_per_step', 0):.0f} kernels per step), by op type and by node (the 30 "
        "layers merged), ms per decode step. The profiler adds a fixed cost to every kernel (here "
        f"{o['run_ms']:.1f} ms profiled vs {p['ort_run_s'] * 1e3:.1f} ms unprofiled, about "
        f"{(o['run_ms'] - p['ort_run_s'] * 1e3) / max(1.0, o.get('nodes_per_step', 1)) * 1e3:.0f} us per "
        "kernel), so small ops look bigger than they are; read it for proportions:\n",
        "| op type | ms | | node | ms |",
        "|---|---|---|---|---|",
    ]
    for x, y in itertools.zip_longest(o["by_op"][:10], o["by_node"][:10]):
        L.append((f"| {x[0]} | {x[1]:.2f} |" if x else "| | |") + (f" | `{y[0]}` | {y[1]:.2f} |" if y else " | | |"))
    return L


def _pyinstrument(p: dict) -> list[str]:
    L = []
    if p.get("pyinstrument_step_children"):
        L += [
            "\nUnder `LLM.step`, per decode step (pyinstrument; the profiler inflates the Python parts):\n",
            "| callee | ms / step |",
            "|---|---|",
        ]
        L += [f"| `{name}` | {v:.3f} |" for name, v in p["pyinstrument_step_children"] if v >= 0.001]
    if p.get("pyinstrument_top"):
        L.append(
            "\nTop of the pyinstrument profile (decode steps only; the profiler itself inflates Python "
            "time, so the split above is the number):\n"
        )
        L.append("```\n" + "\n".join(p["pyinstrument_top"]) + "\n```")
    return L


def _profile(profile: dict) -> list[str]:
    L = ["## Decode step profile (trtpipe, batch 1)\n"]
    if not profile or "error" in profile:
        return L + [f"Not measured: {profile.get('error') if profile else 'skipped (--no-profile)'}\n", ""]
    p = profile
    L.append(
        f"`python bench/profile_decode.py` ({p['num_steps']} decode steps after a {p['prompt_tokens']}-token "
        f"prompt, {p['threads']} threads; trimmed means per step, slowest 10 % dropped):\n"
    )
    L += ["| part | ms / step | share of the step |", "|---|---|---|"]
    for name, key in (
        ("the graph itself (onnxruntime `run_with_iobinding`, or the native engine's `tp_forward`)", "ort_run_s"),
        ("engine wrapper (bind inputs, copy logits)", "engine_wrapper_s"),
        ("runtime Python (scheduler, batch records, sampler, detokenizer, metrics)", "overhead_s"),
        ("whole step (= TPOT)", "step_s"),
    ):
        L.append(f"| {name} | {p[key] * 1e3:.2f} | {p[key] / p['step_s'] * 100:.1f} % |")
    L.append(
        f"\nRuntime overhead (step wall time - `llm.engine_time_s`): {p['overhead_fraction'] * 100:.1f} % of "
        "TPOT; counting the engine wrapper as overhead too: "
        f"{p['overhead_incl_wrapper_fraction'] * 100:.1f} %."
    )
    return L + _ort_ops(p) + _pyinstrument(p) + [""]


def _targets_and_analysis(summary: dict, profile: dict, analysis: str) -> list[str]:
    L = ["## Targets (issue 26)\n", "| target | measured | met |", "|---|---|---|"]
    for what, measured, met, note in targets(summary, profile):
        mark = "n/a" if met is None else ("yes" if met else "**no**")
        L.append(f"| {what} | {measured} | {mark}{': ' + note if note else ''} |")
    L += [
        "",
        ANALYSIS_BEGIN,
        analysis.strip("\n") if analysis.strip() else "## Analysis\n\n(not written yet)",
        ANALYSIS_END + "\n",
    ]
    return L


def _setup(setup_state: dict) -> list[str]:
    L = [
        "## Setup (the peers' venv, `python bench/peers.py --setup`)\n",
        "| step | result | seconds | when |",
        "|---|---|---|---|",
    ]
    for k, v in setup_state.items():
        res = ("ok" + (f" ({v['note']})" if v.get("note") else "")) if v.get("ok") else "FAILED: " + str(v.get("error"))
        L.append(f"| {k} | {res} | {v.get('seconds')} | {v.get('when', '')} |")
    return L + [""]


def _raw_line(e: str, i: int, r: dict, mfl: float | None) -> str:
    if "error" in r:
        return f"{e:18s} #{i}: error: {r['error'][:200]}"
    fl = r.get("foreign_load_cores")
    left_out = mfl is not None and fl is not None and fl > mfl
    return (
        f"{e:18s} #{i}: "
        + " ".join(_ms(r["ttft_s"][str(n)]) for n in PROMPT_LENGTHS)
        + " | "
        + " ".join(_ms(r["tpot_s"][str(n)]) for n in PROMPT_LENGTHS)
        + f" | {r['concurrent']['output_tokens_per_s']:.0f}"
        + f"   (foreign load {'?' if fl is None else f'{fl:.2f}'}, "
        + f"cpu share {r.get('cpu_share', 0):.2f}){'  LEFT OUT' if left_out else ''}"
    )


def _raw(meta: dict, summary: dict, runs: dict, order: list[str]) -> list[str]:
    L = [
        "## Raw numbers, every run\n",
        "ms: TTFT 16/128/512 | TPOT 16/128/512 | 8-request tok/s; then the cores other processes used while "
        "the worker measured (foreign load), and its CPU share (CPU time / (wall x threads)).\n",
        "```",
    ]
    L += [_raw_line(e, i, r, meta.get("max_foreign_load")) for e, rs in runs.items() for i, r in enumerate(rs)]
    L += [
        "```",
        "\nFirst 8 greedy output ids at the 128-token prompt (engines quantize differently, so these may "
        "differ after a few tokens; compare engines by teacher-forced agreement, not free-running text):\n",
        "```",
    ]
    L += [f"{e:18s} {summary[e]['first_output_ids']['128']}" for e in order if "error" not in summary[e]]
    return L + ["```\n"]


def render_markdown(
    meta: dict, summary: dict, runs: dict, profile: dict, setup_state: dict, analysis: str, floors: Floors
) -> str:
    """docs/benchmarks.md: machine, engines, latency and throughput against the peers and the
    physical ``floors``, memory, the decode profile, the issue-26 targets, the kept ``analysis``,
    the setup record and every raw run."""
    order = [e for e in ENGINES if e in summary]
    sections = (
        _header(meta),
        _engines(summary),
        _latency(summary, order, floors),
        _throughput(summary, order, floors),
        _memory(summary, order),
        _profile(profile),
        _targets_and_analysis(summary, profile, analysis),
        _setup(setup_state),
        _raw(meta, summary, runs, order),
    )
    return "\n".join(line for section in sections for line in section)
