"""The native attention kernel alone at long context: one decode step's attention (SmolLM2's 9:3
heads, head 64, blocks of 16) over an L-token pool, per KV dtype, this checkout's kernels against
another git revision's (default ``main``), in one process, interleaved.

Each library is compiled here from its sources (``plugins/cpu/compile.py``'s flags, the host's
best ISA); the other revision's sources come from ``git show <rev>:plugins/cpu/csrc/...``. Per
call: 30 layers' worth of attention (30 pools, as a decode step reads them), median of
``--repeats`` calls, ms, the pool bytes read per call and the ratio to the baseline's kernel on
the same dtype and to the baseline's fp32. Threads: OpenMP's default (all CPUs),
``GOMP_SPINCOUNT=2000`` unless the environment sets a wait policy (as the engine).

Usage: ``python bench/kv_attention_kernel.py [--context 8192] [--rev main] [--repeats 20]``
"""

from __future__ import annotations

import argparse
import ctypes as C
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_gemm import revision_sources  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
H, KVH, D, BS, LAYERS = 9, 3, 64, 16, 30
DTYPES = ("fp32", "fp16", "bf16", "int8")


def sources_at(rev: str, into: Path) -> Path:
    """``rev``'s plugins/cpu/csrc (every file it has) written under ``into``. Exits with a message
    for a revision git does not know or whose kernels predate the KV dtypes (``tp_kv``: another
    ``tp_attention`` signature)."""
    known = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True
    )
    if known.returncode != 0:
        raise SystemExit(
            f"--rev {rev!r}: not a commit of this repository. Fix: a branch, tag or hash (git log --oneline)"
        )
    tp_h = subprocess.run(["git", "show", f"{rev}:plugins/cpu/csrc/tp.h"], cwd=REPO, capture_output=True, text=True)
    if "} tp_kv;" not in tp_h.stdout:  # the pool struct (tp_kv_write alone predates it)
        raise SystemExit(
            f"--rev {rev!r}: its kernels predate the KV pool dtypes (no tp_kv in plugins/cpu/csrc/tp.h), whose "
            "tp_attention this script calls. Fix: a revision from 2026-12-03 on"
        )
    return revision_sources(rev, into)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=8192, help="tokens in the pool (default 8192)")
    ap.add_argument(
        "--rev", default="main", help="git revision whose kernels are the baseline, every dtype (default main)"
    )
    ap.add_argument("--repeats", type=int, default=20, help="calls per kernel, interleaved; the median is kept")
    a = ap.parse_args()
    if a.context < 1 or a.repeats < 1:
        raise SystemExit(f"--context {a.context} --repeats {a.repeats}: expected both >= 1")
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "2000"  # as the native engine sets it (runtime/engines/native.py)
    from trtpipe.plugins.core.kv_codec import kv_encode
    from trtpipe.plugins.cpu import library as L
    from trtpipe.plugins.cpu.compile import compile_sources
    from trtpipe.plugins.cpu.isa import host_isa

    isa = host_isa()
    if isa is None:
        raise SystemExit("this CPU has neither AVX-512 nor AVX2")
    with tempfile.TemporaryDirectory(prefix="kv-attn-") as d:  # the loaded libraries stay mapped
        tmp = Path(d)
        (tmp / "base").mkdir()
        base = sources_at(a.rev, tmp / "base")
        libs = {"this checkout": L.load(compile_sources(isa, REPO / "plugins" / "cpu" / "csrc", tmp / "new.so"))}
        libs[a.rev] = L.load(compile_sources(isa, base, tmp / "base.so"), check=False)  # tp_attention's
        # trailing workspace argument (ABI 2) is ignored by older libraries: NULL there too
    f32p, i64p = L._f32p, L._i64p
    rng = np.random.default_rng(0)
    nb = a.context // BS + 1
    table = np.arange(1, nb, dtype=np.int64).reshape(1, -1)
    ctx, qsl = np.array([a.context], np.int64), np.array([0, 1], np.int64)
    q = rng.standard_normal((1, H * D)).astype(np.float32)
    out = np.zeros((1, H * D), np.float32)
    x = [rng.standard_normal((KVH, nb, BS, D)).astype(np.float32) for _ in range(2 * LAYERS)]
    pools = {d: [kv_encode(p, d) for p in x] for d in ("fp16", "bf16", "int8")}
    args = (table.shape[1], L.ptr(ctx, i64p), L.ptr(qsl, i64p), 1, H, KVH, nb, BS, D, C.c_float(D**-0.5), 0)
    kv = {d: [(p[2 * i], p[2 * i + 1]) for i in range(LAYERS)] for d, p in pools.items()}  # ((k, ks), (v, vs))
    structs = {d: [L.kv_struct(k[0], v[0], k[1], v[1]) for k, v in layers] for d, layers in kv.items()}
    structs["fp32"] = [L.kv_struct(x[2 * i], x[2 * i + 1]) for i in range(LAYERS)]

    def run(lib, d: str) -> None:
        for s in structs[d]:
            lib.tp_attention(L.ptr(q, f32p), H * D, C.byref(s), L.ptr(table, i64p), *args, L.ptr(out, f32p), None)

    runs = {f"{d} ({name})": (lambda lib=lib, d=d: run(lib, d)) for d in DTYPES for name, lib in libs.items()}
    print(
        f"host ISA {isa}; {LAYERS} layers x attention of 1 decode token over {a.context} tokens; medians of {a.repeats}"
    )
    report(interleaved(runs, a.repeats), a.rev, a.context)


def interleaved(runs: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds of each run per repeat, the order alternating."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(repeats):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            t = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t)
    return times


def report(times: dict[str, list[float]], rev: str, context: int) -> None:
    """One row per run: median ms, the ratio to ``rev``'s kernel on the same dtype and to its fp32,
    the pool bytes per call and the read rate."""
    row_bytes = {"fp32": 256, "fp16": 128, "bf16": 128, "int8": 68}  # one token of one kv head, scale included
    med = {name: statistics.median(ts) for name, ts in times.items()}
    fp32_base = med[f"fp32 ({rev})"]
    print(f"| kernel | ms per step | vs {rev}, same dtype | vs {rev} fp32 | pool MB read | GB/s |")
    print("|---|---|---|---|---|---|")
    for name, m in med.items():
        dtype = name.split()[0]
        mb = 2 * LAYERS * KVH * context * row_bytes[dtype] / 1e6
        same = m / med[f"{dtype} ({rev})"]
        print(f"| {name} | {m * 1e3:.2f} | {same:.2f} | {m / fp32_base:.2f} | {mb:.0f} | {mb / 1e3 / m:.1f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
