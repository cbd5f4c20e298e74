"""Time one prefill-graph call of n prompt tokens (+ optional 1-token decode rows) for a sweep of n.

    .venv/bin/python bench/prefill_chunk_sweep.py [--artifact DIR] [--decode-rows 1] [--rounds 3]

Shows how a mixed step's cost grows with its prompt chunk: the per-call cost and the per-token
slope the slo policy trades against the ITL budget (docs/server.md). Each point is the fastest of
3 calls per round, the minimum over interleaved rounds (noise on a shared host only adds time).
Prints ms per call and ms per chunk token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu-slo" / "cpu"))
    ap.add_argument("--decode-rows", type=int, default=1, help="1-token rows after the chunk (a fused mixed step)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.batch import PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill
    from trtpipe.runtime.sched.step_cost import _reserve_block_tables, fastest_s

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
                for i in range(1, 1 + args.decode_rows):  # the token after 64 cached ones
                    rows.append(ScheduledDecode(f"d{i}", 1, 64, tables[i], tables[i][64 // bs] * bs).as_prefill_chunk())
                s = fastest_s(llm.engine.prefill, PrefillBatch.from_scheduled(rows), 3)
                best[n] = min(best.get(n, s), s)
    finally:
        llm.block_pool.free(ids)
    print(f"{args.artifact}: chunk of n tokens + {args.decode_rows} decode row(s), one prefill call")
    for n in SIZES:
        print(f"{n:4d} tokens {best[n] * 1e3:7.1f} ms  {best[n] * 1e3 / n:6.2f} ms/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
