"""The peers' own speculative decoding, without and with, on bench/spec_decode.py's prompts: the
side-by-side of issue 29 (trtpipe's speed-up from speculation against theirs, same engine each).

    flock -x /tmp/trtpipe-heavy.lock .venv/bin/python bench/spec_peers.py --bench-dir /work/wt/peers \
        [--peers llama.cpp,vllm] [--requests 6] [--max-k 4] [--json /tmp/spec_peers.json]
    .venv/bin/python bench/spec_decode.py --peers-json /tmp/spec_peers.json   # trtpipe's side, ratios

- llama.cpp: llama-cpp-python (``.venv-bench``, the host-ISA ``libllama.so`` bench/peers_setup
  builds) with its prompt-lookup drafter, ``LlamaPromptLookupDecoding(max_ngram_size=max_n,
  num_pred_tokens=max_k)``: the proposals are verified as one batch, greedy.
- vLLM CPU: ``vllm.LLM`` (``.venv-bench-vllm``, bf16 on the dequantized GGUF) with
  ``speculative_config={"method": "ngram", "num_speculative_tokens": max_k, "prompt_lookup_min":
  min_n, "prompt_lookup_max": max_n}``.

Both get trtpipe's proposal settings (``--max-k``, ``--max-n``; ``--min-n`` reaches vLLM only:
llama-cpp-python's drafter tries every n-gram size from ``max_n`` down to 1), the same token ids
(the shipped validate scenarios' measured prompts and spec_decode.py's task prompts), greedy, EOS
ignored, batch 1. Each peer runs in four worker processes, plain / speculative / speculative /
plain (ABBA: drift cancels), every request once per process; a request's TPOT per mode is the mean
of its two runs and a scenario's figure the median over its requests. Printed per peer and
scenario: TPOT without and with, the speed-up (without / with) and how many greedy outputs with
speculation equal those without (vLLM's bf16 batch-of-k verify need not be bit-identical).
``--json`` writes ``{peer: {scenario: speed-up}}`` plus the raw figures, for spec_decode.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULT_MARK = "@@spec-peers@@ "
PEERS = {"llama.cpp": "llama.cpp", "vllm": "vllm-bf16"}  # name here -> bench/peers_setup engine


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", help="the folder holding the peers' venvs (sets TRTPIPE_BENCH_DIR)")
    ap.add_argument("--peers", default="llama.cpp,vllm", help=f"comma list from {', '.join(PEERS)}")
    ap.add_argument("--artifact", default=str(HERE.parent / "artifacts" / "smollm2-135m-cpu" / "cpu"),
                    help="trtpipe artifact whose tokenizer and chat template build the prompts")  # fmt: skip
    ap.add_argument("--recipe", default="smollm2-135m-cpu")
    ap.add_argument("--scenarios", default="summary,code,chat", help="shipped scenarios, comma-separated")
    ap.add_argument(
        "--requests",
        type=int,
        default=6,
        help="measured requests per scenario (its first N; more than it has: drawn alike)",
    )
    ap.add_argument("--task-tokens", type=int, default=64, help="output tokens of the task prompts")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--min-n", type=int, default=2)
    ap.add_argument("--max-n", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--worker-timeout", type=float, default=900.0, help="seconds per worker process")
    ap.add_argument("--json", help="write {peer: {scenario: speed-up}} and the raw figures here")
    ap.add_argument("--worker", choices=sorted(PEERS), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("plain", "spec"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    return ap


# ---- worker side (runs in the peer's venv) ----------------------------------------------------


def _adapter(peer: str, mode: str, spec: dict):
    """A bench/peers adapter for ``peer`` whose ``load`` turns the peer's n-gram speculation on
    when ``mode == "spec"``."""
    k, lo, hi = spec["max_k"], spec["min_n"], spec["max_n"]
    if peer == "llama.cpp":
        from peers_workers import LlamaCppAdapter

        class Adapter(LlamaCppAdapter):
            def load(self) -> None:
                from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

                spec_on = mode == "spec"
                draft = LlamaPromptLookupDecoding(max_ngram_size=hi, num_pred_tokens=k) if spec_on else None
                # logits_all with the drafter: llama-cpp-python 0.3.36 sizes its score buffer by
                # n_batch unless logits_all is passed, and a verify past position n_batch fails
                # ("could not broadcast input array from shape (245760,) into shape (196608,)")
                super().load(n_ctx=4096, draft_model=draft, logits_all=spec_on)

    else:
        from peers_anchors import VllmAdapter

        class Adapter(VllmAdapter):
            def load(self) -> None:
                from vllm import LLM, SamplingParams

                extra = {}
                if mode == "spec":
                    extra["speculative_config"] = {
                        "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi,
                    }  # fmt: skip
                self.SamplingParams = SamplingParams
                hf = Path(self.spec["models_dir"]) / "hf-from-gguf"
                self.llm = LLM(model=str(hf), dtype="bfloat16", max_model_len=4096, seed=0, **extra)
                self.engine = self.llm.llm_engine

    return Adapter(spec)


def worker_main(peer: str, mode: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    a = _adapter(peer, mode, spec)
    a.load()
    first = next(iter(spec["workloads"].values()))[0]
    a.run_one(first["ids"], 4)  # warm-up
    res: dict[str, list] = {}
    for name, items in spec["workloads"].items():
        res[name] = []
        for it in items:
            _, tpot, out = a.run_one(it["ids"], it["max_new"])
            res[name].append({"tpot_s": tpot, "out": list(map(int, out))})
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0


# ---- parent side (trtpipe's venv) ---------------------------------------------------------------


def _workloads(args) -> dict[str, list[dict]]:
    from spec_decode import workloads

    from trtpipe.runtime.llm import LLM

    llm = LLM(args.artifact)
    names = [s for s in args.scenarios.split(",") if s]
    w = workloads(llm, args.recipe, names, args.requests, args.task_tokens)
    del llm  # its engine, KV pool and threads are not needed while the peers are timed
    gc.collect()
    return {name: [{"ids": list(ids), "max_new": n} for ids, n in items] for name, items in w.items()}


def _run_worker(peer: str, mode: str, spec_file: Path, threads: int, timeout_s: float) -> dict:
    from peers_measure import python_for
    from peers_setup import ENGINES, engine_env

    eng = ENGINES[PEERS[peer]]
    cmd = [python_for(eng), __file__, "--worker", peer, "--mode", mode, "--spec", str(spec_file)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=engine_env(eng, threads))
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-6:])
    return {"error": f"worker exit {p.returncode}: {tail}"}


def _summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """mode -> [two worker results] to scenario -> figures."""
    out = {}
    for name in runs["plain"][0]:
        plain = [
            statistics.fmean(r[name][i]["tpot_s"] for r in runs["plain"]) for i in range(len(runs["plain"][0][name]))
        ]
        spec = [statistics.fmean(r[name][i]["tpot_s"] for r in runs["spec"]) for i in range(len(runs["spec"][0][name]))]
        same = sum(p["out"] == s["out"] for p, s in zip(runs["plain"][0][name], runs["spec"][0][name]))
        mp, ms = statistics.median(plain), statistics.median(spec)
        out[name] = {"n": len(plain), "identical": same, "tpot_plain_ms": mp * 1e3, "tpot_spec_ms": ms * 1e3,
                     "speedup": mp / ms}  # fmt: skip
    return out


def main(args) -> int:
    if args.bench_dir:
        os.environ["TRTPIPE_BENCH_DIR"] = str(Path(args.bench_dir).resolve())
    from peers_setup import MODELS_DIR, gguf_path

    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise SystemExit(f"--peers: unknown {bad}; expected names from {sorted(PEERS)}")
    spec = {"workloads": _workloads(args), "max_k": args.max_k, "min_n": args.min_n, "max_n": args.max_n,
            "threads": args.threads, "gguf": str(gguf_path()), "models_dir": str(MODELS_DIR)}  # fmt: skip
    print(f"host: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; k {args.max_k}, n {args.min_n}..{args.max_n}")
    result: dict = {"speedup": {}, "raw": {}, "errors": {}}
    with tempfile.TemporaryDirectory() as d:
        spec_file = Path(d) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        for peer in peers:
            runs: dict[str, list] = {"plain": [], "spec": []}
            for mode in ("plain", "spec", "spec", "plain"):
                t = time.monotonic()
                r = _run_worker(peer, mode, spec_file, args.threads, args.worker_timeout)
                print(
                    f"  {peer} {mode}: {r.get('error', 'ok')} ({time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.2f})"
                )
                if "error" in r:
                    result["errors"][peer] = r["error"]
                    break
                runs[mode].append(r)
            if peer in result["errors"]:
                continue
            figs = _summarize(runs)
            result["raw"][peer] = figs
            result["speedup"][peer] = {name: f["speedup"] for name, f in figs.items()}
    print(
        f"\n{'peer':<10} {'scenario':<14} {'n':>3} {'identical':>9} {'TPOT plain':>10} {'TPOT spec':>9} {'speed-up':>8}"
    )
    for peer, figs in result["raw"].items():
        for name, f in figs.items():
            print(f"{peer:<10} {name:<14} {f['n']:>3} {f['identical']:>5}/{f['n']:<3} {f['tpot_plain_ms']:>8.2f}ms "
                  f"{f['tpot_spec_ms']:>7.2f}ms {f['speedup']:>7.2f}x")  # fmt: skip
    for peer, err in result["errors"].items():
        print(f"{peer:<10} did not run: {err}")
    if args.json:
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(args.json)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    _args = _parser().parse_args()
    if _args.worker:
        sys.exit(worker_main(_args.worker, _args.mode, _args.spec))
    t0 = time.perf_counter()
    rc = main(_args)
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(rc)
