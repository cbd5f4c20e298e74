"""Speculative decoding on the real model (SmolLM2, the default artifact): greedy outputs and
logprobs token for token those of plain decoding on the native engine (bit-exact whatever the
chunk), proposals accepted on repetitive text, the per-request opt-out, sampled requests, and the
ONNX Runtime prefill graph returning logits at every position of a verify chunk."""

import numpy as np
import pytest

from trtpipe.runtime.llm import LLM
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.batch import PrefillBatch
from trtpipe.runtime.sched.step import ScheduledPrefill
from trtpipe.runtime.speculative.config import SpeculativeConfig

DOC = (
    "The river Lune rises on the fells above Ravenstonedale and flows through the market town of "
    "Kirkby Lonsdale before it reaches Lancaster. At Lancaster the river Lune meets the tide, and "
    "the quay at Lancaster was once a busy port for ships from the West Indies."
)
PROMPTS = [
    f"Summarize this text in two sentences, using its words.\n\n{DOC}",
    "Complete the Python function.\n\ndef area(width, height):\n    return width * height\n\n"
    "def volume(width, height, depth):\n    return",
    "What is the capital of France?",
]


@pytest.fixture(scope="module")
def llm(default_artifact):
    return LLM(default_artifact, engine="native")


def _run(llm, params):
    return llm.generate(PROMPTS, params, chat=True)


def test_greedy_with_speculation_is_token_for_token_plain_greedy(llm):
    params = SamplingParams(max_new_tokens=40, logprobs=2)
    llm.set_speculative(None)
    plain = _run(llm, params)
    line = llm.set_speculative(SpeculativeConfig(max_k=4, min_n=1, max_n=3))
    assert "measured cost of a verify" in line
    llm.scheduler.speculator.cost = None  # verify every proposal: the test must not depend on the host's speed
    spec = _run(llm, params)
    for a, b in zip(plain, spec):
        assert b.output_token_ids == a.output_token_ids and b.text == a.text
        assert b.logprobs == a.logprobs  # the same logits rows, bit for bit
    c = llm.speculation_counters
    assert c.num_drafts > 5 and c.num_accepted_tokens > 5, c  # the summary quotes its document
    assert sum(c.acceptance_length_counts) == c.num_drafts
    assert llm.block_pool.num_used == 0


def test_opt_out_and_sampled_requests(llm):
    llm.set_speculative(SpeculativeConfig(max_k=4, min_n=1, max_n=3))
    llm.scheduler.speculator.cost = None
    before = llm.speculation_counters.copy()
    out = llm.generate(PROMPTS[:1], SamplingParams(max_new_tokens=24, speculative=False), chat=True)
    assert len(out[0].output_token_ids) > 1
    assert llm.speculation_counters.since(before)["num_drafts"] == 0
    runs = [
        llm.generate(PROMPTS[:1], SamplingParams(max_new_tokens=24, temperature=0.8, seed=5), chat=True)[0]
        for _ in range(2)
    ]
    assert runs[0].output_token_ids == runs[1].output_token_ids  # seeded: reproducible with speculation
    assert llm.speculation_counters.since(before)["num_drafts"] > 0
    assert llm.block_pool.num_used == 0
    llm.set_speculative(None)


def test_the_ort_prefill_graph_returns_every_verified_positions_logits(default_artifact):
    ort = LLM(default_artifact, engine="ort")
    ids = ort.encode_prompt(DOC)[:20]
    bs = ort.kv_manager.block_size
    blocks = ort.block_pool.allocate(-(-len(ids) // bs))
    try:

        def chunk(n):
            slots = tuple(blocks[p // bs] * bs + p % bs for p in range(n))
            return ScheduledPrefill("x", tuple(ids[:n]), 0, tuple(blocks), slots, True)

        every = ort.engine.prefill(PrefillBatch.from_scheduled([chunk(len(ids))], all_logits=("x",)))
        assert every.shape == (len(ids), ort.manifest.model.vocab_size)
        for n in (5, 12, len(ids)):  # the row of position n - 1 is the last-token logits of a chunk of n
            last = ort.engine.prefill(PrefillBatch.from_scheduled([chunk(n)]))[0]
            assert np.argmax(every[n - 1]) == np.argmax(last)
            np.testing.assert_allclose(every[n - 1], last, rtol=0, atol=0.05 * np.abs(last).max())
    finally:
        ort.block_pool.free(blocks)
