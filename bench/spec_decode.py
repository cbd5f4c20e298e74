"""Speculative decoding (n-gram proposals, runtime/speculative) against plain decoding, same engine, one
process, interleaved; batch 1.

    flock -x /tmp/trtpipe-heavy.lock .venv/bin/python bench/spec_decode.py [--requests 6] [--max-k 4]
        [--scenarios summary,code,chat] [--precondition] [--peers-json F | --peer llama.cpp=1.31]
    # greedy identity on 200 requests, exact activations (the ONNX Runtime graphs, accuracy level 0):
    .venv/bin/python bench/spec_decode.py --engine ort --always-verify --scenarios summary,code,chat,assistant \
        --requests 50

For each shipped validate scenario of the default recipe (its measured prompts: corpus slices,
``max_new_tokens`` and ``ignore_eos`` as validate runs them) and for a small task set written for
this bench (a summary that quotes its document, a code completion, a chat question: chat-templated),
every request runs alone twice, plain then speculative or the other way round (alternating), so
both see the same machine. Per scenario it prints: requests whose greedy outputs are identical,
TPOT medians (plain, speculative) and their ratio (speculative / plain: < 1 is faster), the
acceptance rate and mean acceptance length, and the load average around the scenario (other
processes' load: a figure taken on a busy machine is indicative only).

``--precondition``: the verify cost first: the fastest of 25 calls of a decode step (batch 1,
context 64) and of prefill chunks of n = 2..8 tokens with logits at every position (what a verify
of n - 1 proposed tokens costs), as ratios to the decode step. ``--peer NAME=X``: a peer's own
speed-up from its speculation (TPOT without / with, same prompts, measured elsewhere): prints
trtpipe's speed-up / X per scenario (the issue's side-by-side target: >= 1.2); ``--peers-json F``:
the same per scenario, from ``bench/spec_peers.py --json F`` (llama.cpp's prompt lookup, vLLM's
n-gram speculation on these prompts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TASKS = {
    "summary-task": "Summarize the following text in three sentences, reusing its own words.\n\n{doc}",
    "code-task": (
        "Complete this Python module: add a method `scale(self, factor)` to each class, in the same style.\n\n"
        "class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n"
        "        self.height = height\n\n    def area(self):\n        return self.width * self.height\n\n"
        "class Box:\n    def __init__(self, width, height, depth):\n        self.width = width\n"
        "        self.height = height\n        self.depth = depth\n\n    def volume(self):\n"
        "        return self.width * self.height * self.depth\n"
    ),
    "chat-task": "Give me three tips for sleeping better, one sentence each.",
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    ap.add_argument("--recipe", default="smollm2-135m-cpu")
    ap.add_argument("--engine", default="auto", choices=("auto", "native", "ort"),
                    help="the artifact's engine; ort runs its exact-activation graphs (ort_accuracy_level 0)")  # fmt: skip
    ap.add_argument("--scenarios", default="summary,code,chat", help="shipped scenarios, comma-separated")
    ap.add_argument("--requests", type=int, default=6,
                    help="measured requests per scenario (its first N; more than it has: drawn alike)")  # fmt: skip
    ap.add_argument("--task-tokens", type=int, default=64, help="output tokens of the task prompts")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--min-n", type=int, default=2)
    ap.add_argument("--max-n", type=int, default=4)
    ap.add_argument("--precondition", action="store_true", help="print the verify cost first")
    ap.add_argument(
        "--always-verify",
        action="store_true",
        help="verify every proposal of up to --max-k tokens, paying or not (an identity check of the verify "
        "path where the sizing would switch speculation off, e.g. --engine ort)",
    )
    ap.add_argument("--peer", action="append", default=[], help="NAME=SPEEDUP of a peer's speculation")
    ap.add_argument("--peers-json", help="bench/spec_peers.py --json output: the peers' speed-ups per scenario")
    return ap


def _load() -> str:
    return open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"


def precondition(llm) -> None:
    from trtpipe.runtime.speculative.cost import CONTEXT, measure

    c = measure(llm.engine, llm.block_pool, llm.kv_manager.block_size, 7, fused=llm.fuse_mixed_steps, repeats=25)
    ratios = ", ".join(f"n={n}: {c.chunk_s[n - 1] / c.decode_s:.2f}x" for n in (2, 3, 5, 8))
    print(
        f"precondition ({llm.capabilities.backend}, context {CONTEXT}, fastest of 25): decode {c.decode_s * 1e3:.2f} ms; {ratios}"
    )


def workloads(
    llm, recipe_name: str, names: list[str], n: int, task_tokens: int
) -> dict[str, list[tuple[tuple[int, ...], int]]]:
    """scenario -> [(prompt ids, max_new_tokens)]: the shipped scenarios' measured prompts (the first
    ``n`` of each scenario in ``names`` of recipe ``recipe_name``; past the scenario's own count, more
    prompts drawn from its length distributions), then the task prompts (also
    bench/spec_peers.py's workload)."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.validate.runner import scenario_workload_spec
    from trtpipe.runtime.measure.workload import corpus_token_ids, make_workload

    recipe = load_recipe(resolve_recipe_path(recipe_name))
    out = {}
    for sc in recipe.validation.scenarios:
        if sc.name in names:
            spec = scenario_workload_spec(recipe, sc)
            if n > spec.num_requests:  # more prompts of the same distributions (seeded)
                spec = dataclasses.replace(spec, num_requests=n)
            items = make_workload(spec, llm.tokenizer, llm.manifest.model.chat_template)
            out[sc.name] = [(it.prompt_ids, it.max_new_tokens) for it in items if not it.warmup][:n]
    doc = llm.tokenizer.decode(corpus_token_ids(llm.tokenizer)[:220])
    for name, text in TASKS.items():
        out[name] = [(tuple(llm.encode_prompt(text.format(doc=doc), chat=True)), task_tokens)]
    return out


def _run(llm, speculator, ids, max_new):
    from trtpipe.runtime.sample.params import SamplingParams

    llm.scheduler.speculator = speculator  # (a bench: the same speculator on and off between requests)
    (out,) = llm.generate([list(ids)], SamplingParams(max_new_tokens=max_new, ignore_eos=True))
    return out.output_token_ids, out.metrics.tpot_s


def main() -> int:
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.speculative.config import SpeculativeConfig

    llm = LLM(_args.artifact, engine=_args.engine)
    print(f"host: {os.uname().machine}, {os.cpu_count()} cpus, load {_load()}; engine {llm.capabilities.backend}")
    if _args.precondition:
        precondition(llm)
    print(llm.set_speculative(SpeculativeConfig(max_k=_args.max_k, min_n=_args.min_n, max_n=_args.max_n)))
    spec = llm.scheduler.speculator
    if _args.always_verify:
        spec.cost = None  # NgramSpeculator: no cost model, every proposal is verified
    peers = {name: float(x) for name, x in (p.split("=", 1) for p in _args.peer)}
    per_scenario = json.loads(Path(_args.peers_json).read_text())["speedup"] if _args.peers_json else {}
    names = [s for s in _args.scenarios.split(",") if s]
    rows = []
    for name, items in workloads(llm, _args.recipe, names, _args.requests, _args.task_tokens).items():
        load0, before, same, tp, ts = _load(), spec.counters.copy(), 0, [], []
        for i, (ids, max_new) in enumerate(items):
            order = (None, spec) if i % 2 == 0 else (spec, None)
            res = {id(s): _run(llm, s, ids, max_new) for s in order}
            (plain, t_plain), (fast, t_spec) = res[id(None)], res[id(spec)]
            same += plain == fast
            tp.append(t_plain)
            ts.append(t_spec)
        d = spec.counters.since(before)
        mp, ms = statistics.median(tp) * 1e3, statistics.median(ts) * 1e3
        rows.append((name, len(items), same, mp, ms, d, load0, _load()))
    llm.set_speculative(None)
    print(f"\n{'scenario':<14} {'n':>3} {'identical':>9} {'TPOT plain':>10} {'TPOT spec':>9} {'ratio':>6} "
          f"{'accept':>7} {'len':>5}  load (1 min)")  # fmt: skip
    for name, n, same, mp, ms, d, l0, l1 in rows:
        rate = "-" if d["acceptance_rate"] is None else f"{d['acceptance_rate']:.0%}"
        mal = "-" if d["mean_acceptance_length"] is None else f"{d['mean_acceptance_length']:.2f}"
        print(
            f"{name:<14} {n:>3} {same:>5}/{n:<3} {mp:>8.2f}ms {ms:>7.2f}ms {ms / mp:>6.2f} {rate:>7} {mal:>5}  {l0} -> {l1}"
        )
        theirs = dict(peers) | {p: f[name] for p, f in per_scenario.items() if name in f}
        for peer, x in theirs.items():
            print(f"{'':<14} speed-up {mp / ms:.2f}x vs {peer}'s {x:.2f}x: ratio {mp / ms / x:.2f}")
    return 0 if all(same == n for _, n, same, *_ in rows) else 1


if __name__ == "__main__":
    _args = _parser().parse_args()
    t0 = time.perf_counter()
    rc = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(rc)
