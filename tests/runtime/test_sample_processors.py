"""Logits processors and logprobs, against hand-computed values: penalties (vLLM's formulas),
logit_bias, min_tokens, the grammar bitmask (against llguidance's own NumPy kernel), raw and
processed logprobs (against a float64 log-softmax), and the whole step path on a fake engine
with a known vocabulary (the runner passes each row's history to the penalties)."""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample import processors
from trtpipe.runtime.sample.logprobs import log_softmax
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sample.sampler import SampleRow, sample_rows

BASE = np.array([0.0, 1.0, 2.0, 5.0, 4.5, -1.0, 0.0, 0.0], dtype=np.float32)  # V = 8, EOS = 0


def test_penalties_match_hand_computed_values():
    x = np.tile(BASE, (2, 1))
    p = SamplingParams(presence_penalty=0.25, frequency_penalty=0.5, repetition_penalty=2.0)
    processors.apply_penalties(x, [p, SamplingParams()], [[5], [5]], [[3, 3, 4], [3, 3, 4]])
    # token 3: seen, 5 > 0 -> 5 / 2 = 2.5; count 2 -> 2.5 - 0.5 * 2 - 0.25 = 1.25
    # token 4: 4.5 / 2 = 2.25; count 1 -> 2.25 - 0.5 - 0.25 = 1.5
    # token 5: prompt only, -1 <= 0 -> -1 * 2 = -2; no output count -> -2
    want = BASE.copy()
    want[3], want[4], want[5] = 1.25, 1.5, -2.0
    np.testing.assert_array_equal(x[0], want)
    np.testing.assert_array_equal(x[1], BASE)  # a row without penalties is untouched


def test_token_counts_is_one_bincount_per_batch():
    counts = processors.token_counts([[1, 1, 7], [], [0]], 8)
    assert counts.tolist() == [[0, 2, 0, 0, 0, 0, 0, 1], [0] * 8, [1, 0, 0, 0, 0, 0, 0, 0]]


def test_logit_bias_plus_100_forces_and_minus_100_bans():
    rows = [
        SampleRow(SamplingParams(logit_bias={6: 100.0}), None),
        SampleRow(SamplingParams(logit_bias={3: -100.0}), None),
        SampleRow(SamplingParams(temperature=1.0, logit_bias={7: 100.0}), np.random.default_rng(0)),
    ]
    toks, _ = sample_rows(np.tile(BASE, (3, 1)), rows)
    assert toks.tolist() == [6, 4, 7]


def test_min_tokens_suppresses_eos_until_reached_and_stop_token_ids_too():
    logits = BASE.copy()
    logits[0] = 9.0  # EOS is the argmax
    p = SamplingParams(min_tokens=3, stop_token_ids=(3,))
    rows = [SampleRow(p, None, (1,), [4]), SampleRow(p, None, (1,), [4, 4, 4])]
    toks, _ = sample_rows(np.tile(logits, (2, 1)), rows, eos_token_ids=(0,))
    assert toks.tolist() == [4, 0]  # row 0: EOS and stop token 3 masked -> 4; row 1: reached -> EOS


def test_bitmask_agrees_with_llguidances_numpy_kernel():
    lln = pytest.importorskip("llguidance.numpy")
    rng = np.random.default_rng(0)
    vocab = 49152 + 5  # not a multiple of 32: the last word is partial
    logits = rng.normal(size=(4, vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31, size=(4, (vocab + 31) // 32), dtype=np.int64).astype(np.int32)
    mine, theirs = logits.copy(), logits.copy()
    processors.apply_bitmask(mine, bitmask, np.array([1, 3]))
    lln.apply_token_bitmask_inplace(theirs[[1, 3]], bitmask[[1, 3]])  # (fancy index: a copy)
    ref = logits.copy()
    sub = ref[[1, 3]]
    lln.apply_token_bitmask_inplace(sub, bitmask[[1, 3]])
    ref[[1, 3]] = sub
    np.testing.assert_array_equal(mine, ref)
    assert np.isinf(mine[1]).sum() > vocab // 3  # the mask really masks


def _ref_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)


def test_raw_logprobs_equal_a_float64_log_softmax_and_top_is_sorted():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(3, 1000)) * 4).astype(np.float32)
    rows = [SampleRow(SamplingParams(logprobs=5), None), SampleRow(SamplingParams(), None)]
    rows.append(SampleRow(SamplingParams(logprobs=0, temperature=1.0, seed=3), np.random.default_rng(3)))
    toks, lps = sample_rows(logits, rows)
    ref = _ref_log_softmax(logits)
    assert lps[1] is None and lps[0].token_id == toks[0] == logits[0].argmax()
    assert abs(lps[0].logprob - ref[0, toks[0]]) < 1e-5 and abs(lps[2].logprob - ref[2, toks[2]]) < 1e-5
    assert list(lps[0].top_ids) == list(np.argsort(-ref[0])[:5]) and lps[2].top_ids == ()
    np.testing.assert_allclose(lps[0].top_logprobs, np.sort(ref[0])[::-1][:5], atol=1e-5)


def test_processed_logprobs_are_of_what_was_sampled_from():
    logits = np.tile(BASE, (1, 1))
    p = SamplingParams(logprobs=2, temperature=0.5, seed=0, logit_bias={4: 1.0})
    toks, lps = sample_rows(logits, [SampleRow(p, np.random.default_rng(0))], logprobs_mode="processed")
    x = BASE.copy()
    x[4] += 1.0
    ref = _ref_log_softmax((x / 0.5)[None])[0]
    assert lps[0].top_ids == (4, 3)  # 5.5 > 5 after the bias
    np.testing.assert_allclose(lps[0].top_logprobs, ref[[4, 3]], atol=1e-5)
    raw = sample_rows(logits, [SampleRow(p, np.random.default_rng(0))])[1][0]
    assert raw.top_ids == (3, 4)  # raw mode: before the bias


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logit_bias={1: 101}), "logit_bias"),
        (dict(min_tokens=200), "min_tokens"),
        (dict(logprobs=21), "logprobs"),
        (dict(n=9), "n"),
    ],
)
def test_bad_extension_params_name_the_field(kw, field):
    with pytest.raises(RequestError) as e:
        SamplingParams(**kw).validate()
    assert e.value.field == field and field in str(e.value) and "fix" in str(e.value)


# -- the step path on a fake engine ----------------------------------------------------------------


class _FakeEngine:
    """Every row's logits are BASE, whatever the tokens: only the processors change the choice."""

    last_step_s = 0.0
    capabilities = EngineCapabilities("fake", False, False, False, ("fp32",))

    def prefill(self, batch):
        return np.tile(BASE, (len(batch.request_ids), 1))

    def decode(self, batch):
        return np.tile(BASE, (len(batch.request_ids), 1))

    def copy_blocks(self, copies):
        assert not copies, copies  # n = 1 here: nothing forks


def _run(params_list):
    from tokenizers import Tokenizer, models

    from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer
    from trtpipe.runtime.core.step import StepRunner
    from trtpipe.runtime.kv.block_pool import BlockPool
    from trtpipe.runtime.kv.cache_manager import KVCacheManager
    from trtpipe.runtime.metrics.request_metrics import RequestTimer, StepStats
    from trtpipe.runtime.sample.sampler import make_generator
    from trtpipe.runtime.sched.request import new_request
    from trtpipe.runtime.sched.request_output import LiveRequest, RequestOutput
    from trtpipe.runtime.sched.scheduler import Scheduler

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(8)}, unk_token="t0"))
    sched = Scheduler(KVCacheManager(BlockPool(32), 4, 0), 64, 8, 64, eos_token_ids=(0,))
    live: dict = {}
    runner = StepRunner(
        _FakeEngine(), sched, live, StepStats(num_kv_blocks=31), fuse_mixed_steps=False, step_cost=lambda: None
    )
    for i, p in enumerate(params_list):
        req = new_request(f"r{i}", [5], p, max_seq_len=64, vocab_size=8)
        sched.add_request(req)
        out = RequestOutput(req.request_id, req.prompt_token_ids, logprobs=[] if p.logprobs is not None else None)
        live[req.request_id] = LiveRequest(
            req, IncrementalDetokenizer(tok, [5]), RequestTimer(req.request_id, prompt_tokens=1), make_generator(p), out
        )
    outs = {}
    while sched.has_unfinished():
        outs.update({o.request_id: o for o in runner.step()})
    return [outs[f"r{i}"] for i in range(len(params_list))]


def test_penalties_on_a_fake_engine_follow_the_hand_computed_sequence():
    """BASE: token 3 (5.0) beats 4 (4.5). Hand-computed greedy sequences over 5 steps:
    none: 3 3 3 3 3. frequency 1: 3, then 3 -> 4.0 < 4.5: 4, then 4 -> 3.5 < 4.0: 3, 3 -> 3.0: 4, 3.
    presence 1: 3, 4 (4.0 < 4.5), 3 (4.0 > 3.5), 3 (still 4.0 > 3.5), 3.
    repetition 2 (prompt [5]): 3, 4 (2.5 < 4.5), 3 (2.5 > 2.25 > 2), 3, 3."""
    n = 5
    outs = _run(
        [
            SamplingParams(max_new_tokens=n),
            SamplingParams(max_new_tokens=n, frequency_penalty=1.0),
            SamplingParams(max_new_tokens=n, presence_penalty=1.0),
            SamplingParams(max_new_tokens=n, repetition_penalty=2.0, logprobs=1),
        ]
    )
    assert [o.output_token_ids for o in outs] == [[3] * 5, [3, 4, 3, 4, 3], [3, 4, 3, 3, 3], [3, 4, 3, 3, 3]]
    lp = outs[3].logprobs
    assert [r.token_id for r in lp] == [3, 4, 3, 3, 3]  # raw mode: the fake's logits, before penalties
    assert all(r.top_ids == (3,) and abs(r.logprob - float(log_softmax(BASE[None])[0, r.token_id])) < 1e-6 for r in lp)


def test_stop_token_ids_stop_and_min_tokens_holds_them_off_on_a_fake_engine():
    outs = _run(
        [
            SamplingParams(max_new_tokens=6, stop_token_ids=(4,), frequency_penalty=1.0),
            SamplingParams(max_new_tokens=6, logit_bias={0: 100.0}),
            SamplingParams(max_new_tokens=6, logit_bias={0: 100.0}, min_tokens=3),
        ]
    )
    assert outs[0].output_token_ids == [3, 4] and outs[0].finish_reason == "stop"
    assert outs[1].output_token_ids == [0] and outs[1].finish_reason == "stop"  # EOS forced by the bias
    assert outs[2].output_token_ids == [3, 3, 3, 0]  # EOS masked for 3 tokens, then it wins
