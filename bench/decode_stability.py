"""Why does trtpipe's CPU decode latency swing between runs? Fresh processes, interleaved variants.

Each round starts one fresh Python process per variant, in an order that rotates every round, so
machine drift hits every variant alike. A process loads the artifact's ``LLM``, runs one warm-up
request, then measures TPOT (median of the decode-step wall times, ms) for one request at 16 and
at 512 prompt tokens, and prints one JSON line. The parent prints, per variant and context, the
per-round medians and their spread (max / min over rounds), which is the figure issue 13 asks to
bring to the peers' ~1.15x.

Variants (applied inside the child before the artifact loads):
  base          the runtime as shipped
  nospin        ``session.intra_op.allow_spinning = 0`` (ORT's worker threads block instead of
                spinning between parallel sections)
  t1            one intra-op thread
  t2            two intra-op threads, set explicitly (ORT then sets no thread affinity; with the
                count left at 0 it creates one thread per physical core and pins them)
  pinned        the caller (main) thread pinned to CPU 0 and ORT's worker to CPU 1
  thp           glibc malloc backs large allocations (ORT's prepacked weights, arenas) with
                transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``; this kernel's
                THP mode is ``madvise``, so without it no allocation gets huge pages)
  keep_pages    the mapped weight file's pages are not dropped after load
  nofree        glibc keeps freed memory (no trim, large blocks from the heap, not mmap)
  thp_nofree    both

Usage: ``python bench/decode_stability.py --rounds 4 --variants base,nospin,thp``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import DEFAULT_ARTIFACT, prompt_token_ids  # noqa: E402

VARIANTS = ("base", "nospin", "t1", "t2", "pinned", "thp", "keep_pages", "nofree", "thp_nofree")
# glibc malloc settings per variant (GLIBC_TUNABLES); "nofree": large blocks come from the heap
# (mmap threshold at its 32 MiB maximum) and freed memory is never trimmed back to the kernel,
# so a step reuses pages instead of faulting fresh ones in.
_NOFREE = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"
TUNABLES = {"thp": "glibc.malloc.hugetlb=1", "nofree": _NOFREE, "thp_nofree": "glibc.malloc.hugetlb=1:" + _NOFREE}
CONTEXTS = (16, 512)


def _patch(variant: str) -> None:
    """Apply ``variant`` to onnxruntime / the runtime in this (child) process."""
    import onnxruntime as ort

    if variant == "nospin":
        plain = ort.SessionOptions

        def options():
            so = plain()
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            return so

        ort.SessionOptions = options
    elif variant == "pinned":
        os.sched_setaffinity(0, {0})
        plain = ort.SessionOptions

        def options():
            so = plain()
            so.intra_op_num_threads = 2
            so.add_session_config_entry("session.intra_op_thread_affinities", "2")  # 1-based CPU ids
            return so

        ort.SessionOptions = options
    elif variant == "keep_pages":
        from trtpipe.runtime.engines import ort as engine_ort

        engine_ort.OrtEngine.release_mapped_weight_pages = lambda self: False


def _faults() -> int:
    """Minor page faults of this process so far (/proc/self/stat field 10)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def child(artifact: Path, variant: str, num_steps: int) -> dict:
    _patch(variant)
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams

    t0 = time.perf_counter()
    llm = LLM(artifact, num_threads={"t1": 1, "t2": 2}.get(variant))
    load_s = time.perf_counter() - t0
    ids = prompt_token_ids(artifact)
    out = {"variant": variant, "load_s": round(load_s, 2)}

    def one(prompt: list[int]) -> tuple[float, list[float], int, int]:
        """(TTFT s, decode step wall times s, minor faults in prefill, minor faults in decode)"""
        llm.add_request(prompt, SamplingParams(max_new_tokens=num_steps + 1, ignore_eos=True))
        f0 = _faults()
        t = time.perf_counter()
        llm.step()
        ttft = time.perf_counter() - t
        f1 = _faults()
        steps = []
        while llm.has_unfinished():
            t = time.perf_counter()
            llm.step()
            steps.append(time.perf_counter() - t)
        return ttft, steps, f1 - f0, _faults() - f1

    one(ids[32:48])  # warm-up
    for n in CONTEXTS:
        ttft, steps, prefill_faults, decode_faults = one(ids[:n])
        out[f"minflt_prefill_{n}"] = prefill_faults
        out[f"minflt_per_decode_step_{n}"] = round(decode_faults / len(steps), 1)
        out[f"ttft_ms_{n}"] = round(ttft * 1e3, 2)
        out[f"tpot_ms_{n}"] = round(statistics.median(steps) * 1e3, 3)
        out[f"tpot_p90_ms_{n}"] = round(sorted(steps)[int(0.9 * len(steps))] * 1e3, 3)
    with open("/proc/self/status") as f:
        out["rss_mib"] = next(int(row.split()[1]) // 1024 for row in f if row.startswith("VmHWM"))
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
        out["minflt"], out["majflt"] = int(fields[7]), int(fields[9])
    return out


def drift(artifact: Path, seconds: float, window_s: float = 2.0) -> None:
    """One process: decode steps (16-token context, restarted as needed) interleaved with a fixed
    NumPy probe (a [1, 4096] x [4096, 4096] fp32 GEMV, 64 MiB of weights read per call, like a
    decode step's weight sweep), for ``seconds``; prints, per ``window_s`` window, the median
    decode step and the median probe. If both move together, the swing comes from the machine
    (shared cores, memory bandwidth, frequency), not from trtpipe's own state."""
    import numpy as np

    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams

    llm = LLM(artifact)
    ids = prompt_token_ids(artifact)[:16]
    x, w = np.ones((1, 4096), np.float32), np.ones((4096, 4096), np.float32)
    t_end, rows = time.perf_counter() + seconds, []
    print(f"{'t_s':>6} {'decode_ms':>10} {'probe_ms':>9} {'ratio':>6}")
    t0 = time.perf_counter()
    while time.perf_counter() < t_end:
        steps, probes, t_win = [], [], time.perf_counter() + window_s
        while time.perf_counter() < t_win:
            if not llm.has_unfinished():
                llm.add_request(ids, SamplingParams(max_new_tokens=64, ignore_eos=True))
                llm.step()  # prefill
            t = time.perf_counter()
            llm.step()
            steps.append(time.perf_counter() - t)
            t = time.perf_counter()
            x @ w
            probes.append(time.perf_counter() - t)
        d, q = statistics.median(steps) * 1e3, statistics.median(probes) * 1e3
        rows.append((d, q))
        print(f"{time.perf_counter() - t0:6.1f} {d:10.2f} {q:9.2f} {d / q:6.2f}", flush=True)
    ds, qs = [r[0] for r in rows], [r[1] for r in rows]
    print(
        f"spread over windows: decode {max(ds) / min(ds):.2f}x, probe {max(qs) / min(qs):.2f}x, "
        f"decode/probe {max(d / q for d, q in rows) / min(d / q for d, q in rows):.2f}x; "
        f"correlation {np.corrcoef(ds, qs)[0, 1]:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=48, help="decode steps per measured request")
    ap.add_argument("--variants", default="base,nospin,thp")
    ap.add_argument(
        "--drift-s",
        type=float,
        default=None,
        help="instead: one process for this many seconds, decode steps interleaved with a fixed NumPy probe",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drift_s:
        drift(a.artifact, a.drift_s)
        return
    if a.child:
        print("RESULT " + json.dumps(child(a.artifact, a.child, a.steps)), flush=True)
        return
    variants = a.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; expected some of {','.join(VARIANTS)}")
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            env = dict(os.environ)
            if v in TUNABLES:
                env["GLIBC_TUNABLES"] = TUNABLES[v]
            load = os.getloadavg()[0]
            p = subprocess.run(
                [sys.executable, __file__, "--artifact", str(a.artifact), "--steps", str(a.steps), "--child", v],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"variant {v} failed:\n{p.stderr[-2000:]}")
            rec = json.loads(line[7:]) | {"round": r, "load1": round(load, 2)}
            rows[v].append(rec)
            print(json.dumps(rec), flush=True)
    print("\nvariant     ctx  TPOT median per round (ms)          spread  TTFT per round (ms)")
    for v in variants:
        for n in CONTEXTS:
            t = [x[f"tpot_ms_{n}"] for x in rows[v]]
            f = [x[f"ttft_ms_{n}"] for x in rows[v]]
            print(
                f"{v:<11} {n:>4}  {' '.join(f'{x:6.2f}' for x in t):<34} {max(t) / min(t):5.2f}x  "
                f"{' '.join(f'{x:6.0f}' for x in f)}"
            )


if __name__ == "__main__":
    main()
