#!/usr/bin/env python3
"""Where the time of bench/peers.py's 8-request workload goes, step by step (its throughput row:
output tokens/s of 8 concurrent requests).

    python bench/batch_steps.py [--artifact DIR ...] [--rounds 3] [--threads 2]

The workload of ``bench/peers.py``'s throughput row: the 8 prompts of 128 tokens
(``peers_workload.make_spec``'s ``concurrent`` windows), 64 output tokens each (EOS ignored),
added at once, then ``LLM.step()`` until done (the in-process scheduler's defaults, as the peers
bench runs it; prefix caching off, so that every round prefills its prompts as the peers bench's
single run does). Each step is classed by what it carried: ``prefill`` (prompt chunks only),
``mixed`` (prompt chunks beside decodes) or ``decode xB`` (B sequences, no prompt chunk). Per
artifact and round (artifacts interleaved within a round, after two warm-up runs each):

- the whole run's wall time and output tokens/s (512 / wall);
- per class: steps, wall ms summed, the median step's wall and engine ms (``llm.engine_time_s``);
- the integer GEMM rate of the full decode x8 steps: 8 rows x (2 N K over every layer GEMM + the
  LM head) x the artifact's decode activation levels, over the median engine time, GOP/s (the
  instructions run, both levels counted; attention, norms and quantization are in the time too).

Ratios between artifacts hold within one run only; run it alone (``flock -x
/tmp/trtpipe-heavy.lock``). Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import DEFAULT_ARTIFACT  # noqa: E402
from peers_workload import NUM_CONCURRENT, NUM_OUTPUT_TOKENS, make_spec  # noqa: E402


def step_class(num_prompt_tokens: int, decode_rows: int) -> str:
    """``prefill`` / ``mixed`` / ``decode xB`` for a step that ran ``num_prompt_tokens`` prompt
    tokens beside ``decode_rows`` decoding sequences."""
    if num_prompt_tokens and decode_rows:
        return "mixed"
    return "prefill" if num_prompt_tokens else f"decode x{decode_rows}"


def decode_gemm_ops(llm, rows: int) -> int:
    """Integer GEMM operations of a decode step of ``rows`` sequences: 2 N K per weight and row,
    the LM head included, each site's weights times its decode activation levels (each level runs
    the dots again); 0 for an engine without native weights."""
    eng = llm.engine
    layers = getattr(eng, "_layers", None)
    if layers is None:
        return 0
    lv = eng.levels["decode"]
    attention = sum(w.N * w.K for lay in layers for w in (lay.qkv, lay.o))
    mlp = sum(w.N * w.K for lay in layers for w in (lay.gate_up, lay.down))
    head = eng.model.head.N * eng.model.head.K
    return 2 * rows * (attention * lv.attention + mlp * lv.mlp + head * lv.head)


def computed_tokens(llm) -> dict[str, int]:
    """Tokens in the pool per unfinished request id."""
    return {r.request_id: r.num_computed_tokens for r in llm.unfinished_requests()}


def prompt_tokens_run(before: dict[str, int], after: dict[str, int], decode_rows: int) -> int:
    """Prompt tokens a step ran: the tokens its requests gained in the pool (a request that
    finished in the step gained its one decode token) less one per decode row."""
    return sum(after.get(rid, n + 1) - n for rid, n in before.items()) - decode_rows


def run_once(llm, prompts, params) -> tuple[float, list[tuple[str, float, float]]]:
    """One run of the workload: (wall s, [(class, step wall s, step engine s)])."""
    t0 = time.monotonic()
    for p in prompts:
        llm.add_request(list(p), params, arrival_s=t0)
    steps = []
    while llm.has_unfinished():
        before = computed_tokens(llm)
        s, e0 = time.monotonic(), llm.engine_time_s
        llm.step()
        wall, eng = time.monotonic() - s, llm.engine_time_s - e0
        rows = llm.step_stats.decode_batch_sizes[-1]
        steps.append((step_class(prompt_tokens_run(before, computed_tokens(llm), rows), rows), wall, eng))
    return time.monotonic() - t0, steps


def summarize(name: str, wall: float, steps, gemm_ops_x8: int) -> list[str]:
    out = [
        f"{name}: {wall * 1e3:.0f} ms, {NUM_CONCURRENT * NUM_OUTPUT_TOKENS / wall:.0f} output tok/s, {len(steps)} steps"
    ]
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for cls, w, e in steps:
        by[cls].append((w, e))
    for cls in sorted(by, key=lambda c: (c != "prefill", c != "mixed", c)):
        ws, es = [x[0] for x in by[cls]], [x[1] for x in by[cls]]
        line = (f"  {cls:10s} {len(ws):3d} steps, {sum(ws) * 1e3:7.0f} ms in all, median step {statistics.median(ws) * 1e3:6.1f}"
                f" ms (engine {statistics.median(es) * 1e3:6.1f})")  # fmt: skip
        if cls == f"decode x{NUM_CONCURRENT}" and gemm_ops_x8:
            line += f", {gemm_ops_x8 / statistics.median(es) / 1e9:.0f} GOP/s of integer GEMM work"
        out.append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", action="append", type=Path, help=f"artifact dir (repeat; default {DEFAULT_ARTIFACT})")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds, artifacts interleaved (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="engine threads (default 2)")
    a = ap.parse_args()
    if a.rounds < 1 or a.threads < 1:
        raise SystemExit(f"--rounds {a.rounds} --threads {a.threads}: expected both >= 1")
    from trtpipe.runtime.errors import ArtifactError
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams

    artifacts = a.artifact or [DEFAULT_ARTIFACT]
    try:
        llms = {str(p): LLM(p, num_threads=a.threads, prefix_caching=False) for p in artifacts}
    except ArtifactError as e:
        raise SystemExit(f"error: {e}") from None
    spec = make_spec(artifacts[0], a.threads)
    params = SamplingParams(max_new_tokens=NUM_OUTPUT_TOKENS, ignore_eos=True)
    for llm in llms.values():
        for _ in range(2):
            run_once(llm, spec["warmup_concurrent"], params)
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}")
        for name, llm in llms.items():
            wall, steps = run_once(llm, spec["concurrent"], params)
            print("\n".join(summarize(name, wall, steps, decode_gemm_ops(llm, NUM_CONCURRENT))), flush=True)


if __name__ == "__main__":
    main()
