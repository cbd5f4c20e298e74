"""The I8 weight kind (GGUF's kernel form) against Q8 in the host CPU GEMM: bytes per weight of
each kind, and tp_gemm's time per call at M = 1 and M = 128 for [N, K] = [2048, 640] and
[640, 2048] (Gemma 3 270M's gate/up and down shapes; hidden 640, 2048 ffn), interleaved.

    .venv/bin/python bench/i8_gemm.py [--rounds 9] [--repeats 5] [--threads 1] [--levels 1,2]

Kinds: ``q8`` (fp16 d), ``q4`` (for scale), and I8 as ``i8`` (group 32, symmetric: Q8_0 / Q5_0 /
Q4_0), ``i8+offset`` (group 32 with offsets: Q4_K / Q5_K / Q4_1 / Q5_1) and ``i8/16`` (group 16:
Q6_K), from random codes and scales (timing does not depend on the values). Activations are
quantized once (tp_quant_act_halves); only tp_gemm is timed. Each round times every (shape, M,
kind) in turn (fastest of ``--repeats`` calls); the table gives medians over rounds and each
kind's time relative to q8's. The host drifts on shared machines: take the ratios, and run it
alone (``flock -x /tmp/trtpipe-heavy.lock``). Writes nothing.
"""

from __future__ import annotations

import argparse
import ctypes as C
import os
import statistics
import sys
import time

import numpy as np

SHAPES = ((2048, 640), (640, 2048))  # (N, K)
POINTS = (1, 128)


def _weights(N: int, K: int, rng: np.random.Generator) -> dict:
    from trtpipe.plugins.core.gguf_blocks import KernelBlocks
    from trtpipe.plugins.cpu import layout

    codes = rng.integers(-128, 128, (N, K), dtype=np.int8)
    d = (rng.standard_normal((N, K // 32)) * 0.01).astype(np.float16).astype(np.float32)
    s16 = rng.standard_normal((N, K // 16)).astype(np.float32) * np.float32(0.01)
    neg0 = lambda a: np.full(a.shape, -0.0, np.float32)  # noqa: E731
    return {
        "q8": layout.tile_q8((codes.astype(np.int16) + 128).astype(np.uint8), d),
        "q4": layout.tile_q4(rng.integers(0, 16, (N, K), dtype=np.uint8), d, d),
        "i8": layout.tile_i8(KernelBlocks("Q8_0", 32, codes, d, neg0(d))),
        "i8+offset": layout.tile_i8(KernelBlocks("Q4_K", 32, codes, d, d)),
        "i8/16": layout.tile_i8(KernelBlocks("Q6_K", 16, codes, s16, neg0(s16))),
    }


def _fastest_ms(lib, ws, qa, y, N: int, repeats: int) -> float:
    from trtpipe.plugins.cpu import library as L

    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        lib.tp_gemm(C.byref(ws), C.byref(qa.struct), L.ptr(y, L._f32p), N, 0)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--levels", default="1,2", help="activation levels to time, comma-separated")
    args = ap.parse_args(argv)
    from trtpipe.plugins.cpu import library as L
    from trtpipe.plugins.cpu.compile import compile_library
    from trtpipe.plugins.cpu.isa import host_isa

    isa = host_isa()
    if isa is None:
        print("this CPU runs none of the kernels' ISAs", file=sys.stderr)
        return 2
    lib = L.load(compile_library(isa))
    lib.tp_set_threads(args.threads)
    rng = np.random.default_rng(0)
    weights = {shape: _weights(*shape, rng) for shape in SHAPES}
    print("| kind | bytes / weight |\n|---|---|")
    for kind, w in weights[SHAPES[0]].items():
        print(f"| {kind} | {w.nbytes / (w.N * w.K):.4f} |")
    cases = []  # (shape, M, levels, kind, weight struct, activations, y)
    for levels in (int(v) for v in args.levels.split(",")):
        for (N, K), ws in weights.items():
            for M in POINTS:
                qa = L.quant_act(lib, rng.standard_normal((M, K)).astype(np.float32), levels, halves=True)
                for kind, w in ws.items():
                    cases.append(((N, K), M, levels, kind, w, L.weight_struct(w), qa, np.zeros((M, N), np.float32)))
    times: list[list[float]] = [[] for _ in cases]
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for i, (shape, _m, _lv, _k, _w, ws, qa, y) in enumerate(cases):
            times[i].append(_fastest_ms(lib, ws, qa, y, shape[0], args.repeats))
    med = [statistics.median(t) for t in times]
    print(
        f"\n{isa} kernels, {args.threads} thread(s); load average (1 min) {load0:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end; medians of {args.rounds} interleaved rounds x fastest of {args.repeats}\n"
    )
    print(
        "| [N, K] | M | levels | kind | ms | / q8 | M = 1: weight GB/s; M = 128: GOP/s |\n|---|---|---|---|---|---|---|"
    )
    base = {(c[0], c[1], c[2]): med[i] for i, c in enumerate(cases) if c[3] == "q8"}
    for i, (shape, M, levels, kind, w, *_rest) in enumerate(cases):
        rel = med[i] / base[(shape, M, levels)]
        rate = w.nbytes / med[i] / 1e6 if M == 1 else 2 * M * shape[0] * shape[1] / med[i] / 1e6
        print(f"| {shape[0]}x{shape[1]} | {M} | {levels} | {kind} | {med[i]:.3f} | {rel:.2f} | {rate:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
