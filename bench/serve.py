#!/usr/bin/env python3
"""``trtpipe serve`` against the serving anchors, vLLM CPU's OpenAI server and llama.cpp's own
``llama-server``, driven by two clients nobody here wrote, aiperf and vLLM's benchmark client
(issue 27).

    python bench/serve.py --setup                    # install/build what the servers and clients need
    python bench/serve.py                            # probe, >= 5 rates x 3 servers x 2 clients, docs/serving.md
    python bench/serve.py --rates 1,2 --servers trtpipe,llama-server --clients vllm-bench --max-minutes 10
    python bench/serve.py --from-json docs/serving.json          # re-render docs/serving.md, measure nothing

Servers (bench/serve_commands.py): one at a time (2 cores: never two loaded at once), each started
fresh on 127.0.0.1 and a free port for each rate, driven by each client in turn, then stopped.

Clients (bench/serve_clients.py): aiperf, and vLLM's ``vllm.benchmarks.serve.main`` (what ``vllm
bench serve`` runs) from the vLLM venv.

Workload (bench/serve_clients.py), the same for every server and client: random prompts of 128
tokens, 64 output tokens with the end of sequence ignored, streamed ``/v1/completions``, greedy,
Poisson arrivals, ``--requests-per-rate`` requests per run after ``--warmup-requests``.

Rates: a capacity probe (each server under ``--probe-concurrency`` concurrent requests, the first
client) gives each server's requests/s; ``--num-rates`` rates (>= 5) spaced geometrically from
0.25 x the slowest server's to 1.25 x the fastest one's, so the top rate saturates every server.
``--rates`` skips the probe. Interleaved: for each rate, every server, the order rotating from rate
to rate, so drift of the shared machine hits all alike.

Figures (bench/serve_goodput.py, computed here from each client's per-request records, the same
way for both clients): goodput and SLO attainment as DistServe defines them (a request is good when
its TTFT <= 200 ms and its TPOT <= 50 ms; attainment = good / sent, 503s, failures and unfinished
requests counting as misses; capacity at the SLOs = the highest rate with attainment >= 90 %), TTFT
p50/p95 and TPOT p50/p95 over all requests sent, ITL p99 over every token gap, rejections, ratios
trtpipe / each anchor, and a PNG of goodput and TTFT p95 against the rate.

Everything is written to docs/serving.md (its hand-written analysis section is kept), the raw
results to docs/serving.json (``--from-json`` re-renders from it) and the plot to
docs/serving-goodput.png.
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
import peers_llamacpp  # noqa: E402
import peers_setup  # noqa: E402
import serve_report  # noqa: E402
from serve_clients import CLIENTS  # noqa: E402
from serve_commands import DEFAULT_SERVERS, SERVERS, TRTPIPE_SERVERS, trtpipe_has_threads  # noqa: E402
from serve_goodput import TPOT_SLO_MS, TTFT_SLO_MS, pick_rates  # noqa: E402
from serve_run import server_session  # noqa: E402
from serve_setup import AIPERF_VENV, BENCH_VENV, load_setup_state, setup, tokenizer_dir, unavailable_reason  # noqa: E402

REPO = peers.REPO
MAIN_VENV = peers.MAIN_VENV
DEFAULT_ARTIFACT = peers.DEFAULT_ARTIFACT
DEFAULT_DOC = REPO / "docs" / "serving.md"


def _rotate(xs: list[str], i: int) -> list[str]:
    k = i % len(xs)
    return xs[k:] + xs[:k]


def probe_capacity(servers: list[str], args, work: Path) -> tuple[dict, dict[str, float]]:
    """Each server under ``--probe-concurrency`` concurrent requests (the first client): its runs
    and its capacity in requests/s (finished requests / duration)."""
    probe, caps = {}, {}
    c = args.probe_concurrency
    for e in servers:
        (r,) = server_session(e, args.clients[:1], {"concurrency": c, "count": 2 * c}, args, work, "probe")
        probe[e] = r
        _print_run("probe", r)
        f = r.get("figures")
        if f and f["done"] and f["duration_s"]:
            caps[e] = f["done"] / f["duration_s"]
    if not caps:
        raise SystemExit("the capacity probe failed on every server; see the errors above")
    return probe, caps


def measure(servers: list[str], args, work: Path, t_start: float) -> tuple[dict, list[dict]]:
    """The probe (unless ``--rates``), then for each rate every server (rotating order) and in each
    server session every client (rotating order); runs past ``--max-minutes`` are recorded as skipped."""
    probe, caps = ({}, {}) if args.rates else probe_capacity(servers, args, work)
    rates = args.rates or pick_rates(caps, args.num_rates)
    if caps:
        print("capacity (req/s): " + ", ".join(f"{e} {c:.2f}" for e, c in caps.items()) + f" -> rates {rates}")
    runs: list[dict] = []
    t_session: dict[str, float] = {}  # each server's longest session so far: the estimate of its next
    for i, rate in enumerate(rates):
        for e in _rotate(servers, i):
            clients = _rotate(args.clients, i)
            if time.monotonic() - t_start + t_session.get(e, 0.0) > args.max_minutes * 60:
                why = f"skipped: --max-minutes {args.max_minutes:g}"
                runs += [{"engine": e, "client": c, "load": {"rate": rate}, "error": why} for c in clients]
                print(f"skip {e} at {rate:g} req/s: another session would pass --max-minutes", flush=True)
                continue
            if args.wait_quiet > 0:
                peers.wait_quiet(args.wait_quiet, args.max_foreign_load)
            t0 = time.monotonic()
            load = {"rate": rate, "count": args.requests_per_rate}
            session = server_session(e, clients, load, args, work, f"rate{i}")
            t_session[e] = max(t_session.get(e, 0.0), time.monotonic() - t0)
            for r in session:
                _print_run(f"{rate:g} req/s", r)
            runs += session
    return {"rates": rates, "probe": probe, "capacity_rps": caps}, runs


def _print_run(what: str, r: dict) -> None:
    if "error" in r:
        print(f"[{what}] {r['engine']} / {r.get('client')}: ERROR {r['error']}", flush=True)
        return
    f = r["figures"]
    ms = lambda x: "—" if x is None else f"{x:.0f}"  # noqa: E731
    print(
        f"[{what}] {r['engine']:12s} {r['client']:10s} goodput {f['goodput_rps']:.2f} req/s "
        f"(attainment {f['attainment']:.0%}), done {f['done']}/{f['sent']}, rejected {f['rejected']}, "
        f"TTFT p50/p95 {ms(f['ttft_p50_ms'])}/{ms(f['ttft_p95_ms'])} ms, TPOT p50 {ms(f['tpot_p50_ms'])} ms, "
        f"ITL p99 {ms(f['itl_p99_ms'])} ms ({r['wall_s']:.0f} s; CPU server {r['server_cpu_cores']}, "
        f"client {r['client_cpu_cores']}, foreign {r['foreign_load_cores']} cores)",
        flush=True,
    )


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def _csv(kind: str, allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        xs = [x.strip() for x in text.split(",") if x.strip()]
        if bad := [x for x in xs if x not in allowed]:
            raise argparse.ArgumentTypeError(f"unknown {kind} {bad}; expected names from {list(allowed)}")
        return xs

    return parse


def _parser() -> argparse.ArgumentParser:
    """The command line: tool setup, what runs, load, limits, then servers and paths."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=_HelpFormatter
    )
    ap.add_argument("--setup", action="store_true", help="only install the tools (retrying failed steps)")
    ap.add_argument(
        "--no-setup", action="store_true", help="install nothing; a server or client not set up is an error"
    )
    ap.add_argument(
        "--bench-dir",
        type=Path,
        help="the folder holding the venvs (.venv-bench*), default the repo root; reuse another "
        "checkout's, e.g. --bench-dir /work/wt/peers",
    )
    ap.add_argument("--llama-amx", action="store_true", help="build llama.cpp with AMX (off: it crashed)")
    ap.add_argument("--servers", type=_csv("server", SERVERS), default=list(DEFAULT_SERVERS), help="comma list")
    ap.add_argument("--clients", type=_csv("client", CLIENTS), default=list(CLIENTS), help="comma list")
    _add_load_options(ap)
    _add_server_options(ap)
    return ap


def _add_load_options(ap: argparse.ArgumentParser) -> None:
    """The load the clients offer and the limits of each run."""
    ap.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        help="Poisson request rates in req/s, e.g. 0.5,1,2; unset: chosen by a capacity probe",
    )
    ap.add_argument("--num-rates", type=int, default=5, help="rates the probe spreads (unless --rates)")
    ap.add_argument("--requests-per-rate", type=int, default=40, help="measured requests per server, client, rate")
    ap.add_argument("--warmup-requests", type=int, default=2, help="client warm-up requests before each run")
    ap.add_argument("--probe-concurrency", type=int, default=8, help="concurrent requests of the capacity probe")
    ap.add_argument("--run-timeout", type=float, default=600.0, metavar="S", help="kill a client run after S s")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=60.0,
        help="start no server session that would end past this many minutes of measuring (setup not counted)",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        metavar="S",
        help="before each session, wait up to S seconds for other processes to use less than "
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
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="artifact trtpipe serves")
    ap.add_argument(
        "--fast-artifact",
        type=Path,
        default=peers_setup.DEFAULT_FAST_ARTIFACT,
        help=f"artifact server trtpipe-fast serves (recipe {peers_setup.FAST_RECIPE})",
    )
    ap.add_argument("--llama-parallel", type=int, default=8, help="llama-server --parallel (slots)")
    ap.add_argument("--load-timeout", type=float, default=300.0, metavar="S", help="server start-up limit")
    ap.add_argument("--out", type=Path, default=DEFAULT_DOC, help="markdown report (docs/serving.md)")
    ap.add_argument("--json", type=Path, help="raw results (default: --out with .json)")
    ap.add_argument("--plot", type=Path, help="PNG of goodput and TTFT p95 vs rate (default: --out with -goodput.png)")
    ap.add_argument("--from-json", type=Path, metavar="RAW", help="measure nothing: rewrite --out from RAW")
    ap.add_argument("--keep-artifacts", type=Path, metavar="DIR", help="keep the clients' output folders here")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raw_path = args.json or args.out.with_suffix(".json")
    args.plot = args.plot or args.out.with_name(args.out.stem + "-goodput.png")
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        _write(raw, args)
        print(f"wrote {args.out} from {args.from_json}")
        return 0
    return run(args, raw_path)


def _write(raw: dict, args) -> str:
    """docs/serving.md (and the PNG, for the anchors' format) from ``raw``; the markdown."""
    if raw.get("format") == 2:
        import serve_plot

        raw["meta"]["plot"] = serve_plot.plot(raw, args.plot)
    md = serve_report.render(raw, serve_report.read_analysis(args.out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    return md


def _require_project_venv(bench_dir: Path | None) -> None:
    """Re-execute under the project venv's Python (tokenizers must import), with TRTPIPE_BENCH_DIR
    set when ``--bench-dir`` names another folder than bench/peers_setup.py read at import.

    Raises SystemExit when that venv is missing or is this Python already.
    """
    argv = [str(Path(__file__).resolve()), *sys.argv[1:]]
    if bench_dir is not None and bench_dir.resolve() != peers_setup.BENCH_DIR:
        if not bench_dir.is_dir():
            raise SystemExit(f"--bench-dir {bench_dir}: no such folder")
        os.environ["TRTPIPE_BENCH_DIR"] = str(bench_dir.resolve())
        os.execv(sys.executable, [sys.executable, *argv])
    try:
        import tokenizers  # noqa: F401
    except ImportError:  # the orchestrator needs the project venv's tokenizers (like bench/peers.py)
        py = MAIN_VENV / "bin" / "python"
        if py.exists() and Path(sys.executable).resolve() != py.resolve():
            os.execv(str(py), [str(py), *argv])
        raise SystemExit("run from the project venv (tokenizers must import): . .venv/bin/activate") from None


def _check_ready(args) -> dict:
    """Set up what the servers and clients need (unless ``--no-setup``); the setup state. Raises
    SystemExit naming what is missing."""
    names = [*args.servers, *args.clients]
    state = load_setup_state()
    if args.setup or (not args.no_setup and any(unavailable_reason(n, state) for n in names)):
        state = setup(names, retry_failed=args.setup, amx=args.llama_amx)
        if args.setup:
            raise SystemExit(0 if not any(unavailable_reason(n, state) for n in names) else 1)
    if why := [f"{n}: {w}" for n in names if (w := unavailable_reason(n, state))]:
        raise SystemExit("; ".join(why))
    trtpipe_servers = set(TRTPIPE_SERVERS) & set(args.servers)
    if trtpipe_servers and not args.trtpipe.exists():
        raise SystemExit(f"--trtpipe {args.trtpipe}: no such executable. Fix: pip install -e '.[serve]' into .venv")
    if not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"{args.artifact}: no built artifact. Fix: trtpipe build recipes/smollm2-135m-cpu.yaml")
    if "trtpipe-fast" in args.servers and not (args.fast_artifact / "manifest.json").is_file():
        raise SystemExit(f"{args.fast_artifact}: no built artifact. Fix: trtpipe build {peers_setup.FAST_RECIPE}")
    return state


def run(args, raw_path: Path) -> int:
    _require_project_venv(args.bench_dir)
    state = _check_ready(args)
    trtpipe_servers = set(TRTPIPE_SERVERS) & set(args.servers)
    args.trtpipe_threads_flag = bool(trtpipe_servers) and trtpipe_has_threads(args.trtpipe)
    args.vllm_python = peers_setup.venv_python("vllm")
    args.hf_model = peers_setup.MODELS_DIR / "hf-from-gguf"
    args.llama_server = peers_llamacpp.server_binary(peers_setup.BENCH_DIR)
    args.llama_python = BENCH_VENV / "bin" / "python"
    args.aiperf_venv = AIPERF_VENV
    t_start, load_start = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trtpipe-servebench-") as tmp:
        work = Path(tmp)
        args.tokenizer_dir = tokenizer_dir(args.artifact)
        try:
            plan, runs = measure(args.servers, args, work, t_start)
        finally:
            if args.keep_artifacts:
                shutil.copytree(work, args.keep_artifacts, dirs_exist_ok=True)
    raw = {"format": 2, "meta": _meta(args, state, raw_path, t_start, load_start), "plan": plan, "runs": runs}
    raw_path.write_text(json.dumps(raw, indent=1))
    md = _write(raw, args)
    raw_path.write_text(json.dumps(raw, indent=1))
    print("\n" + md.split(serve_report.ANALYSIS_BEGIN)[0])
    print(f"wrote {args.out}, {raw_path} and {args.plot}")
    return 0


def _meta(args, state: dict, raw_path: Path, t_start: float, load_start) -> dict:
    """The report's record of how the runs were made: settings, workload, machine, versions, setup."""
    import serve_anchors_report
    import serve_clients

    machine = peers.machine_info()
    machine["loadavg_start"], machine["loadavg_end"] = load_start, os.getloadavg()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "servers": args.servers,
        "clients": args.clients,
        "threads": args.threads,
        "requests_per_rate": args.requests_per_rate,
        "warmup_requests": args.warmup_requests,
        "probe_concurrency": args.probe_concurrency,
        "workload": {
            "input_tokens": serve_clients.INPUT_TOKENS,
            "output_tokens": serve_clients.OUTPUT_TOKENS,
            "seed": serve_clients.SEED,
        },
        "note": args.note,
        "max_foreign_load": args.max_foreign_load,
        "raw_json": str(_rel(raw_path)),
        "slo": {"ttft_ms": TTFT_SLO_MS, "tpot_ms": TPOT_SLO_MS},
        "machine": machine,
        "wall_s": round(time.monotonic() - t_start, 1),
        "command": shlex.join(["python", "bench/serve.py", *sys.argv[1:]]),
        "versions": serve_anchors_report.anchor_versions(args),
        "setup": state,
    }


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
