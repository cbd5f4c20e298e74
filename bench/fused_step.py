"""One engine call per mixed step, measured: prefill chunk + decodes apart vs in one prefill call.

    .venv/bin/python bench/fused_step.py [--rounds 7] [--artifact DIR]

Issue 12's lever: a step that carries a prefill chunk and running decodes calls the engine twice
(prefill graph, then the decode tokens). The default CPU artifact decodes through the prefill
graph already (``ort_decode_graph: prefill``), so the decode tokens could ride in the prefill
call as 1-token chunks and the weights would be read once per step. This script times, per
point (chunk tokens, chunk context, decodes, decode context), the two calls apart and the one
fused call, interleaved round by round (A, B, A, B ...; the host drifts 20-50 % within
minutes), with block tables as long as the scheduler would give them, and prints the median of
each and the ratio fused / apart. Writes nothing.

The fused call is built exactly as a scheduler step would be: the chunk plus one
``ScheduledPrefill`` of one token per decode (its position, block table and slot), packed by
``PrefillBatch.from_scheduled``; the decode logits are the rows of those 1-token chunks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (chunk tokens, chunk context, decodes, context per decode): the slo policy's operating points
# (one or a few blocks next to 1-4 decodes) and one large chunk.
POINTS = ((16, 256, 2, 256), (32, 256, 2, 256), (16, 256, 4, 256), (64, 0, 2, 128), (128, 0, 2, 128), (16, 0, 1, 32))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per point (default 7)")
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trtpipe.runtime.kv.planning import cdiv
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

    llm = LLM(args.artifact, scheduler_policy="fcfs")
    engine, pool, bs = llm.engine, llm.block_pool, llm.kv_manager.block_size
    if getattr(engine, "decode_graph", None) != "prefill":
        print("this artifact decodes through its own decode graph: nothing to fuse", file=sys.stderr)
        return 2

    def table(tokens: int) -> tuple[int, ...]:
        ids = pool.allocate(cdiv(tokens, bs))
        if ids is None:
            raise SystemExit("the KV pool is too small for the probe's block tables")
        return tuple(ids)

    def slots(t: tuple[int, ...], start: int, n: int) -> tuple[int, ...]:
        return tuple(t[p // bs] * bs + p % bs for p in range(start, start + n))

    def timed(call, batch) -> float:
        t = time.perf_counter()
        call(batch)
        return (time.perf_counter() - t) * 1e3

    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds per point")
    print(
        "| chunk tokens @ context | decodes @ context | prefill call ms | decode call ms | apart ms | fused ms | fused / apart |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, c, b, ctx in POINTS:
        t0 = table(c + n)
        chunk = ScheduledPrefill("chunk", (1,) * n, c, t0, slots(t0, c, n), True)
        decs = []
        for i in range(b):
            ti = table(ctx + 1)
            decs.append(ScheduledDecode(f"d{i}", 1, ctx, ti, slots(ti, ctx, 1)[0]))
        as_chunks = [
            ScheduledPrefill(d.request_id, (d.token_id,), d.position, d.block_table, (d.slot,), True) for d in decs
        ]
        pb, db = PrefillBatch.from_scheduled([chunk]), DecodeBatch.from_scheduled(decs)
        fb = PrefillBatch.from_scheduled([chunk, *as_chunks])
        engine.prefill(fb)  # warm-up of this shape
        rows: list[tuple[float, float, float]] = []
        for _ in range(args.rounds):
            rows.append((timed(engine.prefill, pb), timed(engine.decode, db), timed(engine.prefill, fb)))
        p, d, f = (statistics.median(r[i] for r in rows) for i in range(3))
        apart = statistics.median(r[0] + r[1] for r in rows)
        print(f"| {n} @ {c} | {b} @ {ctx} | {p:.1f} | {d:.1f} | {apart:.1f} | {f:.1f} | {f / apart:.2f} |")
        pool.free([*t0, *(x for dd in decs for x in dd.block_table)])
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
