"""Fused mixed steps (recipe ``engine.ort_fused_steps``) on the real model: a step's prompt chunk
and decode tokens in one prefill-graph call give the logits of the two separate calls.

The oracle is the unfused path of the same artifact (prefill call + decode call; those are
checked against transformers in tests/pipeline/test_export_parity.py). The artifact keeps fp32
activations (MatMulNBits accuracy_level 0), so a row's logits depend on the batch around it only
through float summation order (~1e-5 relative): greedy tokens must agree exactly, including
near-ties (int8 activations, the default, move logits by ~5e-3 and can flip the 25.33 / 25.24
tie after "The capital of France is Paris").
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fused_artifact(gguf_path, tmp_path_factory):
    from conftest import _build, make_test_recipe

    engine = {"ort_accuracy_level": 0, "ort_fused_steps": True}
    return _build(tmp_path_factory, lambda root: make_test_recipe(root, "fused", "int4", "int4", engine=engine))


def _slots(table, start, n, bs):
    return tuple(table[p // bs] * bs + p % bs for p in range(start, start + n))


def test_one_call_gives_the_two_calls_logits(fused_artifact):
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

    llm = LLM(fused_artifact, scheduler_policy="fcfs")
    assert llm.capabilities.fuses_mixed_steps and llm.fuse_mixed_steps
    bs, eng = llm.kv_manager.block_size, llm.engine
    ids = llm.tokenizer.encode("The lighthouse stood at the end of a long spit of sand, and the keeper " * 6)
    tables = [tuple(llm.block_pool.allocate(8)) for _ in range(3)]
    # histories: A has 37 prompt tokens, B 50, C 21 (written by one prefill call)
    ctx = (37, 50, 21)
    eng.prefill(
        PrefillBatch.from_scheduled(
            [
                ScheduledPrefill(f"s{i}", tuple(ids[:c]), 0, tables[i], _slots(tables[i], 0, c, bs), True)
                for i, c in enumerate(ctx)
            ]
        )
    )
    chunk = ScheduledPrefill("A", tuple(ids[37:61]), 37, tables[0], _slots(tables[0], 37, 24, bs), True)
    decs = [
        ScheduledDecode(r, ids[c], c, tables[i], _slots(tables[i], c, 1, bs)[0])
        for r, i, c in (("B", 1, 50), ("C", 2, 21))
    ]
    apart_chunk = eng.prefill(PrefillBatch.from_scheduled([chunk]))[0]
    apart_dec = eng.decode(DecodeBatch.from_scheduled(decs))
    # decodes first in the list: PrefillBatch puts the 1-token rows last, rows follow request_ids
    batch = PrefillBatch.from_scheduled([d.as_prefill_chunk() for d in decs] + [chunk])
    assert batch.request_ids == ("A", "B", "C")
    fused = eng.prefill(batch)
    for got, want in ((fused[0], apart_chunk), (fused[1], apart_dec[0]), (fused[2], apart_dec[1])):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        assert int(np.argmax(got)) == int(np.argmax(want))


def test_fused_llm_steps_match_the_unfused_outputs(fused_artifact):
    """Requests arriving while others decode: the fused runtime runs mixed steps as one call and
    produces the same greedy tokens as the unfused runtime on the same artifact."""
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams

    prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers.",
        "Explain what a lighthouse does in two sentences.",
    ]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    outs, calls = {}, {}
    for fuse in (True, False):
        llm = LLM(fused_artifact, scheduler_policy="fcfs", prefix_caching=False, fuse_mixed_steps=fuse)
        n_decode_calls = 0
        real_decode = llm.engine.decode

        def counting(batch, real_decode=real_decode):
            nonlocal n_decode_calls
            n_decode_calls += 1
            return real_decode(batch)

        llm.engine.decode = counting
        rids, done = [], []
        for p in prompts:  # one new request every 3 steps, the earlier ones decoding
            rids.append(llm.add_request(p, params, chat=True))
            for _ in range(3):
                done += llm.step()
        done += llm.run_until_done()
        by_id = {o.request_id: o.output_token_ids for o in done}
        outs[fuse] = [by_id[r] for r in rids]
        calls[fuse] = n_decode_calls
        assert llm.block_pool.num_used == 0
    assert outs[True] == outs[False]
    # each later prompt arrives while the earlier ones decode: its one-chunk prefill step is a
    # mixed step, whose decodes the fused runtime sends through the prefill call instead
    assert calls[True] == calls[False] - (len(prompts) - 1)


@pytest.mark.parametrize("flag", ["fuse_mixed_steps", "prefix_caching"])
@pytest.mark.parametrize("value", ["no", "false", 0, None])
def test_llm_refuses_a_flag_that_is_not_a_bool(tmp_path, flag, value):
    """`LLM(..., fuse_mixed_steps="no")` was truthy and silently fused: a non-bool is refused,
    naming the argument and the value, before the artifact is even read (tmp_path is empty)."""
    from trtpipe.runtime.errors import RequestError
    from trtpipe.runtime.llm import LLM

    with pytest.raises(RequestError, match=rf"^{flag} = {value!r}: expected True or False"):
        LLM(tmp_path, **{flag: value})
