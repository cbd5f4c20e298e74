"""The native engine's step cost at n tokens: this checkout's kernels against a baseline's, interleaved.

    .venv/bin/python bench/native_gemm.py [--baseline-ref main] [--rounds 5] [--repeats 5] [--artifact DIR]

Per n in 1, 2, 3, 5, 8, 16, 128, 512 tokens: n = 1 is ``engine.decode`` of one row at context 64;
n >= 2 is ``engine.prefill`` of one n-token chunk, at context 64 for n <= 16 (a speculative
verify chunk, a small decode batch's GEMM shapes) and as a fresh prompt for n >= 128 (TTFT's
GEMMs). Both libraries run in one process over the same artifact weights and KV pool: the
engine's library is swapped between calls. "current" is compiled from this checkout's
``plugins/cpu/csrc``, "baseline" from ``--baseline-ref``'s (``git show``), both for the
artifact's ISA with ``plugins/cpu/compile.py``'s flags and each in its ``--*-form`` (how ``levels:
2`` is held: int8x2 or int16, default the ISA's, ``plugins/cpu/isa.py``; ``--baseline-ref HEAD
--baseline-form int8x2`` compares the two forms of one revision). The baseline is loaded without
the ABI check (an older revision's tp_forward; run only across ABIs whose tp_model and tp_step
are the same). Each round times every n for A then B
(fastest of ``--repeats`` calls); the table gives medians over rounds, each library's cost
relative to its own decode step (``x decode``), current / baseline, whether the two give
bit-identical logits, and the useful int8 GEMM
rate at n >= 128 (2 n N K over the step's GEMMs, one head row; two activation levels run twice
the instructions). The host drifts on shared machines: take the ratios, not the absolute times,
and run it alone (``flock -x /tmp/trtpipe-heavy.lock``). Writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POINTS = (1, 2, 3, 5, 8, 16, 128, 512)
CONTEXT = 64  # tokens already in the pool for n <= 16


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-ref", default="main", help="git revision whose kernel sources are the baseline")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--repeats", type=int, default=5, help="calls per point per round, fastest kept (default 5)")
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    ap.add_argument("--points", default=",".join(map(str, POINTS)), help="comma-separated token counts")
    ap.add_argument("--current-form", default=None, help="int8x2 or int16 (default: the ISA's)")
    ap.add_argument("--baseline-form", default=None, help="int8x2 or int16 (default: the ISA's)")
    return ap


def revision_sources(ref: str, into: Path) -> Path:
    """``ref``'s plugins/cpu/csrc (every file it has) written under ``into`` (also bench/kv_attention_kernel.py's)."""
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:plugins/cpu/csrc"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in names:
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:plugins/cpu/csrc/{name}"], capture_output=True, check=True
        ).stdout
        (into / name).write_bytes(blob)
    return into


def _gemm_ops(engine, n: int) -> int:
    """2 n N K over a step's layer GEMMs, plus the head for one row."""
    per_row = sum(w.N * w.K for lay in engine._model._layers for w in (lay.qkv, lay.o, lay.gate_up, lay.down))
    return 2 * n * per_row + 2 * engine.model.head.N * engine.model.head.K


def _measure(engine, libs: dict, batches: dict, rounds: int, repeats: int, same: dict[int, bool]):
    """Median over rounds of the fastest of ``repeats`` calls (ms), per library and point; each
    round runs every point with every library in turn (the engine's library swapped). Fills
    ``same[n]``: whether the libraries' logits are bit-identical at point n."""

    def fastest_ms(call, b) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            call(b)
            best = min(best, time.perf_counter() - t)
        return best * 1e3

    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in batches} for k in libs}
    for n, (call, b) in batches.items():  # warm-up, and the logits of each library compared
        outs = []
        for lib in libs.values():
            engine.lib = lib
            outs.append(call(b).tobytes())
        same[n] = len(set(outs)) == 1
    for _ in range(rounds):
        for n, (call, b) in batches.items():
            for name, lib in libs.items():
                engine.lib = lib
                times[name][n].append(fastest_ms(call, b))
    return {k: {n: statistics.median(v) for n, v in t.items()} for k, t in times.items()}


def _print_table(engine, med: dict[str, dict[int, float]], points: list[int], same: dict[int, bool]) -> None:
    print(
        "| tokens | current ms | x decode | baseline ms | x decode | current / baseline | current GOP/s | same logits |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in points:
        c, b = med["current"][n], med["baseline"][n]
        rel = lambda k, v: f"{v / med[k][1]:.2f}x" if 1 in med[k] else "-"  # noqa: E731
        gops = f"{_gemm_ops(engine, n) / c / 1e6:.0f}" if n >= 128 else "-"
        print(
            f"| {n} | {c:.2f} | {rel('current', c)} | {b:.2f} | {rel('baseline', b)} | {c / b:.3f} | {gops} | {'yes' if same[n] else 'no'} |"
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trtpipe.plugins.cpu import library as L
    from trtpipe.plugins.cpu.compile import compile_library, compile_sources
    from trtpipe.runtime.kv.planning import cdiv
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

    llm = LLM(args.artifact, prefix_caching=False, scheduler_policy="fcfs")
    engine, pool, bs = llm.engine, llm.block_pool, llm.kv_manager.block_size
    if engine.capabilities.backend != "native":
        print(f"{args.artifact} does not run the native engine", file=sys.stderr)
        return 2
    points = [int(p) for p in args.points.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="native-gemm-"))
    libs = {
        "current": L.load(compile_library(engine.isa, form=args.current_form)),
        "baseline": L.load(
            compile_sources(engine.isa, revision_sources(args.baseline_ref, tmp), tmp / "base.so", args.baseline_form),
            check=False,
        ),
    }
    for lib in libs.values():
        lib.tp_set_threads(engine.threads)
    table = tuple(pool.allocate(cdiv(CONTEXT + max(points), bs)) or ())
    if not table:
        raise SystemExit("the KV pool is too small for the probe's block table")

    def batch(n: int):
        start = CONTEXT if n <= 16 else 0
        if n == 1:
            return engine.decode, DecodeBatch.from_scheduled([ScheduledDecode("d", 1, start, table, _slot(start))])
        slots = tuple(_slot(p) for p in range(start, start + n))
        return engine.prefill, PrefillBatch.from_scheduled([ScheduledPrefill("c", (1,) * n, start, table, slots, True)])

    def _slot(p: int) -> int:
        return table[p // bs] * bs + p % bs

    batches = {n: batch(n) for n in points}
    load0 = os.getloadavg()[0]
    same: dict[int, bool] = {}
    med = _measure(engine, libs, batches, args.rounds, args.repeats, same)
    print(
        f"{engine.isa} kernels, {engine.threads} threads, forms {args.current_form or 'default'} / "
        f"{args.baseline_form or 'default'}, baseline {args.baseline_ref}; load average (1 min) "
        f"{load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; medians of {args.rounds} rounds x fastest of "
        f"{args.repeats}"
    )
    _print_table(engine, med, points, same)
    pool.free(list(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
