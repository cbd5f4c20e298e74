"""Time one prefill-graph call of n prompt tokens (+ optional 1-token decode rows) for a sweep of n.

    .venv/bin/python bench/prefill_chunk_sweep.py [--artifact DIR] [--decode-rows 1] [--rounds 3]

Shows how a mixed step's cost grows with its prompt chunk: the per-call cost and the per-token
slope the slo policy trades against the ITL budget and the ITL-during-prefill ratio
(docs/server.md). Point 0 is the decode-only step of the same rows (the engine's decode call);
each point is the fastest of 3 calls per round, the minimum over interleaved rounds (noise on a
shared host only adds time). Prints ms per call, the ms each chunk token adds to the decode-only
step and the step over the decode-only step (what a decoding stream's gap grows by while a prompt
prefills beside it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu-slo" / "cpu"))
    ap.add_argument("--decode-rows", type=int, default=1, help="1-token rows after the chunk (a fused mixed step)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.decode_rows < 1 or args.rounds < 1:
        raise SystemExit(f"--decode-rows {args.decode_rows} --rounds {args.rounds}: expected both >= 1")
    from trtpipe.runtime.core.calibrate import _reserve_block_tables
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill
    from trtpipe.runtime.sched.step_cost import fastest_s

    llm = LLM(args.artifact, prefix_caching=False, scheduler_policy="fcfs")
    bs = llm.kv_manager.block_size
    ids, tables = _reserve_block_tables(llm.block_pool, bs, 1 + args.decode_rows)
    best: dict[int, float] = {}
    try:
        for _ in range(args.rounds):
            for n in SIZES:
                t = tables[0]
                rows = [
                    ScheduledPrefill("chunk", (1,) * n, 0, t, tuple(t[p // bs] * bs + p % bs for p in range(n)), True)
                ]
                decodes = [  # the token after 64 cached ones
                    ScheduledDecode(f"d{i}", 1, 64, tables[i], tables[i][64 // bs] * bs)
                    for i in range(1, 1 + args.decode_rows)
                ]
                if n == 0:
                    s = fastest_s(llm.engine.decode, DecodeBatch.from_scheduled(decodes), 3)
                else:
                    rows += [d.as_prefill_chunk() for d in decodes]
                    s = fastest_s(llm.engine.prefill, PrefillBatch.from_scheduled(rows), 3)
                best[n] = min(best.get(n, s), s)
    finally:
        llm.block_pool.free(ids)
    print(
        f"{args.artifact}: chunk of n tokens + {args.decode_rows} decode row(s), one prefill call (n = 0: decode call)"
    )
    for n in SIZES:
        per_token = f"+{(best[n] - best[0]) * 1e3 / n:5.2f} ms/token" if n else " " * 15
        print(f"{n:4d} tokens {best[n] * 1e3:7.1f} ms  {per_token}  {best[n] / best[0]:5.2f}x the decode-only step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
