"""bench/batch_steps.py without measuring: a step's class from the tokens it ran, the prompt tokens
counted from the pool's growth, the GEMM work of a decode step, and the summary lines (hand-computed)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import batch_steps  # noqa: E402


def test_step_class():
    assert batch_steps.step_class(512, 0) == "prefill"
    assert batch_steps.step_class(256, 4) == "mixed"
    assert batch_steps.step_class(0, 8) == "decode x8"


def test_prompt_tokens_from_the_pools_growth():
    # a: 100 prompt tokens of a chunk; b, c decode one token each; d finished in the step (gone
    # from the unfinished requests: its one decode token); e waiting before the step (0 tokens in
    # the pool), admitted in it with a 30-token chunk
    before = {"a": 28, "b": 140, "c": 150, "d": 191, "e": 0}
    after = {"a": 128, "b": 141, "c": 151, "e": 30}
    assert batch_steps.prompt_tokens_run(before, after, decode_rows=3) == 130
    assert batch_steps.prompt_tokens_run({"b": 5}, {"b": 6}, decode_rows=1) == 0


def test_decode_gemm_ops_counts_each_sites_levels():
    w = lambda n, k: SimpleNamespace(N=n, K=k)  # noqa: E731
    layer = SimpleNamespace(qkv=w(10, 4), o=w(4, 4), gate_up=w(16, 4), down=w(4, 8))
    levels = SimpleNamespace(attention=2, mlp=1, head=2)
    eng = SimpleNamespace(_layers=[layer, layer], model=SimpleNamespace(head=w(50, 4)), levels={"decode": levels})
    # per row: attention 2 layers x (40 + 16) x 2 levels = 224; mlp 2 x (64 + 32) x 1 = 192; head 200 x 2 = 400
    assert batch_steps.decode_gemm_ops(SimpleNamespace(engine=eng), rows=3) == 2 * 3 * (224 + 192 + 400)
    assert batch_steps.decode_gemm_ops(SimpleNamespace(engine=SimpleNamespace()), rows=3) == 0


def test_summary_lines():
    steps = [("prefill", 0.4, 0.39)] + [("decode x8", 0.010, 0.009)] * 3
    lines = batch_steps.summarize("a", 0.5, steps, gemm_ops_x8=9_000_000)
    assert lines[0] == "a: 500 ms, 1024 output tok/s, 4 steps"
    assert lines[1].split() == "prefill 1 steps, 400 ms in all, median step 400.0 ms (engine 390.0)".split()
    assert lines[2].endswith("1 GOP/s of integer GEMM work")  # 9e6 ops / 9 ms
    assert "30 ms in all" in lines[2]
