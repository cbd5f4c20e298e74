"""bench/serve.py, the two clients nobody here wrote, on one workload: random prompts of
:data:`INPUT_TOKENS` tokens, :data:`OUTPUT_TOKENS` output tokens with the end of sequence ignored,
streamed ``/v1/completions`` (no chat template: the prompt length is the one sent), greedy,
Poisson arrivals (or a fixed concurrency for the capacity probe).

- ``aiperf``: NVIDIA's client (``aiperf profile``, its own venv), synthetic prompts of exactly that
  length; per-request records from its ``profile_export.jsonl``.
- ``vllm-bench``: vLLM's benchmark client from the vLLM venv, ``vllm.benchmarks.serve.main`` with
  the parser of ``add_cli_args`` (:data:`VLLM_BENCH_SERVE`: exactly what ``vllm bench serve`` runs;
  the ``vllm`` console script looks up the distribution "vllm" and fails, and the module has no
  ``__main__`` block, so ``python -m vllm.benchmarks.serve`` does nothing), the ``random``
  dataset; per-request lists from its ``--save-detailed`` result file.

Both are turned into the same per-request records (bench/serve_goodput.py), so goodput, TTFT p95
over the requests sent and ITL p99 are computed here the same way for both, not by each client's
own summary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

INPUT_TOKENS = 128
OUTPUT_TOKENS = 64
SEED = 27
CLIENTS = ("aiperf", "vllm-bench")
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def load_args(load: dict) -> tuple[str, str]:
    """(kind, value) of a load: ("rate", "2.5") or ("concurrency", "8")."""
    return ("rate", f"{load['rate']:g}") if "rate" in load else ("concurrency", str(load["concurrency"]))


def aiperf_command(aiperf: Path, url: str, model: str, load: dict, tokenizer: Path, out_dir: Path, warmup: int) -> list:
    """``aiperf profile`` for one run (``load``: {"rate", "count"} or {"concurrency", "count"})."""
    kind, value = load_args(load)
    cmd = [str(aiperf), "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming"]
    cmd += ["--synthetic-input-tokens-mean", str(INPUT_TOKENS), "--synthetic-input-tokens-stddev", "0"]
    # max_tokens, not max_completion_tokens: llama.cpp's servers ignore the latter
    cmd += ["--output-tokens-mean", str(OUTPUT_TOKENS), "--output-tokens-stddev", "0", "--use-legacy-max-tokens"]
    cmd += ["--extra-inputs", json.dumps({"ignore_eos": True, "temperature": 0.0})]
    cmd += ["--tokenizer", str(tokenizer), "--random-seed", str(SEED), "--artifact-dir", str(out_dir)]
    # one worker and one record processor: the client shares the 2 cores with the server
    cmd += ["--ui-type", "none", "--no-server-metrics", "--no-auto-plot", "--no-gpu-telemetry"]
    cmd += ["--workers-max", "1", "--record-processors", "1", "--warmup-request-count", str(warmup)]
    cmd += ["--request-count", str(load["count"])]
    if kind == "rate":
        cmd += ["--request-rate", value, "--arrival-pattern", "poisson"]
    else:
        cmd += ["--concurrency", value]
    return cmd


def vllm_bench_command(python: Path, url: str, model: str, load: dict, tokenizer: Path, out_dir: Path, warmup: int):
    """vLLM's benchmark client for one run (what ``vllm bench serve`` runs: :data:`VLLM_BENCH_SERVE`)."""
    kind, value = load_args(load)
    cmd = [str(python), "-c", VLLM_BENCH_SERVE, "--backend", "openai", "--base-url", url]
    cmd += ["--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer)]
    cmd += ["--dataset-name", "random", "--random-input-len", str(INPUT_TOKENS)]
    cmd += ["--random-output-len", str(OUTPUT_TOKENS), "--random-range-ratio", "0.0", "--ignore-eos"]
    cmd += ["--temperature", "0", "--seed", str(SEED), "--num-prompts", str(load["count"])]
    cmd += ["--num-warmups", str(warmup), "--ready-check-timeout-sec", "0", "--disable-tqdm"]
    cmd += ["--goodput", "ttft:200", "tpot:50", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    cmd += ["--metric-percentiles", "50,95,99", "--save-result", "--save-detailed"]
    cmd += ["--result-dir", str(out_dir), "--result-filename", "vllm-bench.json"]
    if kind == "rate":
        cmd += ["--request-rate", value, "--burstiness", "1.0"]  # burstiness 1: Poisson arrivals
    else:
        cmd += ["--request-rate", "inf", "--max-concurrency", value]
    return cmd


def client_env(client: str) -> dict:
    """aiperf: HF offline variables removed (aiperf 0.13.0 offline looks a local tokenizer folder up
    in the hub cache and fails; online it reads the folder without network access)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if client == "vllm-bench":
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return env | {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def _status(text: str | None) -> int | None:
    """The HTTP status an error message names (503 / 429), else None."""
    t = (text or "").lower()
    if "503" in t or "service unavailable" in t:
        return 503
    if "429" in t or "too many requests" in t:
        return 429
    return None


def _value(metrics: dict, name: str):
    v = metrics.get(name)
    return v.get("value") if isinstance(v, dict) else v


def aiperf_records(out_dir: Path) -> tuple[list[dict], float | None]:
    """(per-request records of the profiling phase, benchmark duration in s) from aiperf's
    ``profile_export.jsonl`` and ``profile_export_aiperf.json`` under ``out_dir``."""
    found = sorted(out_dir.rglob("profile_export.jsonl"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export.jsonl under {out_dir}")
    records = []
    for line in found[0].read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, m, err = rec.get("metadata") or {}, rec.get("metrics") or {}, rec.get("error")
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        n_out = _value(m, "output_sequence_length") or 0
        gaps = _value(m, "inter_chunk_latency") or []
        ok = err is None and not meta.get("was_cancelled") and _value(m, "time_to_first_token") is not None
        msg = None if err is None else json.dumps(err)[:300]
        code = err.get("code") if isinstance(err, dict) else None
        records.append(
            {
                "ok": ok,
                "ttft_ms": _value(m, "time_to_first_token"),
                "tpot_ms": _value(m, "inter_token_latency") if n_out > 1 else None,
                "itl_ms": list(gaps) if isinstance(gaps, list) else [],
                "output_tokens": int(n_out),
                "error": msg,
                "status": code if isinstance(code, int) else _status(msg),
            }
        )
    summary = sorted(out_dir.rglob("profile_export_aiperf.json"))
    duration = None
    if summary:
        d = json.loads(summary[0].read_text())
        duration = _value(d.get("records", d), "benchmark_duration")
    return records, duration


def vllm_bench_records(out_dir: Path) -> tuple[list[dict], float | None]:
    """(per-request records, duration in s) from ``vllm-bench.json`` (``--save-detailed``:
    ``ttfts`` and ``itls`` in seconds, ``output_lens``, ``errors`` per request)."""
    d = json.loads((out_dir / "vllm-bench.json").read_text())
    latencies = d.get("latencies") or [None] * len(d["ttfts"])
    records = []
    for ttft, itl, n_out, err, lat in zip(d["ttfts"], d["itls"], d["output_lens"], d["errors"], latencies):
        ok = not err
        # vLLM's own TPOT: (latency - TTFT) / (output tokens - 1); the gaps' sum when no latency
        decode_s = (lat - ttft) if lat is not None else sum(itl)
        records.append(
            {
                "ok": ok,
                "ttft_ms": ttft * 1e3 if ok else None,
                "tpot_ms": decode_s * 1e3 / (n_out - 1) if ok and n_out > 1 else None,
                "itl_ms": [g * 1e3 for g in itl] if ok else [],
                "output_tokens": int(n_out) if ok else 0,
                "error": (err or None) and str(err)[:300],
                "status": None if ok else _status(str(err)),
            }
        )
    return records, d.get("duration")
