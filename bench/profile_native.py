#!/usr/bin/env python3
"""Where a prefill's and a decode step's time go on the native CPU engine, by kernel class,
sampled with Linux ``perf`` (not CI: needs ``perf`` and permission to profile this process).

    .venv/bin/python bench/profile_native.py [--tokens 128,512] [--reps 8] [--threads 2]
                                             [--decode-steps 64] [--artifact artifacts/smollm2-135m-cpu/cpu]

For each prompt length: load the artifact once, warm up, then attach ``perf record -F 999 -p
<this process>`` around (1) ``--reps`` prefills of random token ids (one output token each, no
prefix-cache hit) and (2) ``--decode-steps`` batch-1 decode steps after such a prompt (EOS
ignored). ``perf report --sort dso,symbol`` is folded into kernel classes (the GEMM tile
functions, attention, activation quantization, the elementwise ops, OpenMP's runtime, the OS
kernel, Python and the rest), printed as % of the samples and as ms of one prefill or step
(% x the measured wall time; with N threads the samples cover N cores, so a class's ms is its
share of the wall time, not a serial time).

The engine's kernels are in ``plugins/cpu/csrc`` (docs/design.md, "CPU engines"); the GEMM tile
functions are named ``{pairs,wide,i16}_{q4,q8,i8,i8s,i8h}_l{levels}_r{rows}`` (gemm.c).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (class, regex over the symbol name), first match wins
CLASSES = (
    ("GEMM (int8 / int16 activations x 4/8-bit weights)", r"^(pairs|wide|i16)_(q[48]|i8[sh]?)_l[12]_r\d+$|^tp_gemm"),
    # decode_rows: an fp16 / bf16 / int8 pool block read and decoded to fp32 (where its DRAM reads land)
    ("attention (paged, causal)", r"^tp_attention|^block_scores|^attend|^softmax|^decode_rows|^i8_"),
    ("activation quantization (int8 levels)", r"^tp_quant_act|^quant_"),
    ("RMSNorm", r"^tp_rmsnorm"),
    ("SiLU x up", r"^tp_silu_mul"),
    ("RoPE", r"^tp_rope"),
    ("KV write", r"^tp_kv_write|^encode_row"),
    ("embedding", r"^tp_embed"),
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, default=ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu")
    ap.add_argument("--tokens", default="128,512", help="comma list of prompt lengths")
    ap.add_argument("--reps", type=int, default=8, help="profiled prefills per length")
    ap.add_argument("--decode-steps", type=int, default=64, help="profiled decode steps per length (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    return ap


def classify(symbol: str, dso: str) -> str:
    """The kernel class of one ``perf report`` row (symbol name, shared object)."""
    for name, pattern in CLASSES:
        if re.search(pattern, symbol):
            return name
    if "libgomp" in dso:
        return "OpenMP runtime (barriers, waits)"
    if dso.startswith("[kernel"):
        return "OS kernel (page faults, scheduling)"
    if "python" in dso or "libpython" in dso:
        return "Python"
    return "other"


def perf_shares(data: Path) -> dict[str, float]:
    """``perf report`` of ``data`` folded into :data:`CLASSES`: {class: % of samples}."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol", "--stdio", "-g", "none"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(\S+)", line)
        if m:
            cls = classify(m.group(3), m.group(2))
            shares[cls] = shares.get(cls, 0.0) + float(m.group(1))
    return shares


def _perf(tmp: Path, name: str, work) -> tuple[float, dict[str, float]]:
    """Run ``work()`` (returns its count of units, >= 1) under ``perf record`` attached to this
    process: (wall ms per unit, {class: %}). perf is stopped whatever ``work`` raises."""
    data = tmp / f"perf-{name}.data"
    rec = subprocess.Popen(
        ["perf", "record", "-F", "999", "-p", str(os.getpid()), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # perf attaches
        if rec.poll() is not None:
            raise SystemExit(f"perf record failed: {rec.stderr.read().strip()[-500:]}")
        t = time.perf_counter()
        units = max(work(), 1)
        wall_ms = (time.perf_counter() - t) / units * 1e3
    finally:
        if rec.poll() is None:
            rec.send_signal(signal.SIGINT)
            try:
                rec.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rec.kill()
    return wall_ms, perf_shares(data)


def profile_length(llm, n: int, reps: int, decode_steps: int, tmp: Path) -> dict[str, tuple[float, dict[str, float]]]:
    """{"prefill": (ms per prefill, shares), "decode": (ms per step, shares)} at ``n`` prompt tokens."""
    from trtpipe.runtime.sample.params import SamplingParams

    rng = random.Random(n)

    def prompt() -> list[int]:
        return [rng.randrange(100, 40000) for _ in range(n)]

    one = SamplingParams(max_new_tokens=1)
    for _ in range(2):
        llm.generate([prompt()], one)

    def prefills() -> int:
        for _ in range(reps):
            llm.generate([prompt()], one)
        return reps

    out = {"prefill": _perf(tmp, f"prefill-{n}", prefills)}
    if decode_steps > 0:
        llm.generate([prompt()], SamplingParams(max_new_tokens=8, ignore_eos=True))  # warm
        llm.add_request(prompt(), SamplingParams(max_new_tokens=decode_steps + 1, ignore_eos=True))
        llm.step()  # the prefill

        def steps() -> int:
            k = 0
            while llm.has_unfinished():
                llm.step()
                k += 1
            return k

        out["decode"] = _perf(tmp, f"decode-{n}", steps)
    return out


def main() -> int:
    args = _parser().parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Linux perf tools, e.g. apt install linux-tools-common)")
    from trtpipe.runtime.llm import LLM

    llm = LLM(args.artifact, num_threads=args.threads)
    limits = llm.manifest.limits
    for n in (int(x) for x in args.tokens.split(",")):
        if not 1 <= n <= limits.max_num_tokens or n + args.decode_steps + 1 > limits.max_seq_len:
            raise SystemExit(
                f"--tokens {n}: expected 1..{limits.max_num_tokens} (one prefill chunk) with "
                f"n + --decode-steps + 1 <= max_seq_len {limits.max_seq_len}"
            )
    if llm.capabilities.backend != "native":
        raise SystemExit(f"{args.artifact}: runs on {llm.capabilities.backend}, not the native CPU engine")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"host: {cpu}, {os.cpu_count()} CPUs; artifact {args.artifact}; {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="trtpipe-perf-") as tmp:
        for n in (int(x) for x in args.tokens.split(",")):
            for phase, (wall_ms, shares) in profile_length(llm, n, args.reps, args.decode_steps, Path(tmp)).items():
                total = sum(shares.values()) or 1.0
                what = "prefill" if phase == "prefill" else "decode step (batch 1)"
                print(f"\n{what} at {n} prompt tokens: {wall_ms:.2f} ms (wall, mean)")
                print("| kernel class | % of samples | ms |")
                print("|---|---|---|")
                for cls, pct in sorted(shares.items(), key=lambda kv: -kv[1]):
                    print(f"| {cls} | {pct / total * 100:.1f} | {pct / total * wall_ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
