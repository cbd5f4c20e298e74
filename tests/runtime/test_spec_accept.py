"""Verification of proposed tokens (runtime/speculative/accept.py): greedy acceptance is exact, the
rejection rule leaves the sampled distribution unchanged (chi-square on a small vocabulary,
fixed seeds), processors see the history plain decoding would, logprobs match plain decode's."""

import numpy as np
import pytest

from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sample.sampler import SampleRow, filtered_distribution, make_generator, sample_rows
from trtpipe.runtime.speculative.accept import accept_sampled, verify

V = 8


def onehot_logits(argmaxes):
    x = np.zeros((len(argmaxes), V), np.float32)
    x[np.arange(len(argmaxes)), argmaxes] = 5.0
    return x


@pytest.mark.parametrize(
    "targets, drafts, tokens, accepted",
    [
        ([3, 4, 5, 6], [3, 4, 5], (3, 4, 5, 6), 3),  # all accepted + the bonus token
        ([3, 4, 5, 6], [3, 1, 5], (3, 4), 1),  # the second is wrong: corrected to 4, rest dropped
        ([3, 4, 5, 6], [2, 4, 5], (3,), 0),  # the first is wrong
        ([3, 4], [3], (3, 4), 1),
    ],
)
def test_greedy_keeps_the_matching_prefix_and_one_more(targets, drafts, tokens, accepted):
    row = SampleRow(SamplingParams(), None, (1, 2), [7])
    got = verify(onehot_logits(targets), drafts, row)
    assert got.token_ids == tokens and got.num_accepted == accepted and got.logprobs == (None,) * len(tokens)


def test_each_position_sees_the_drafts_before_it_like_plain_decode():
    # a frequency penalty of 2 on the output history: position j's history includes drafts 1..j
    params = SamplingParams(frequency_penalty=2.0, logprobs=2)
    rng = np.random.default_rng(0)
    logits = np.random.default_rng(1).normal(size=(4, V)).astype(np.float32) * 3
    drafts, history = [5, 2, 7], [5]
    got = verify(logits, drafts, SampleRow(params, rng, (1,), history), logprobs_mode="processed")
    # plain decode, one step at a time with the emitted tokens appended
    out, lps = list(history), []
    for j in range(len(got.token_ids)):
        toks, rec = sample_rows(logits[j : j + 1], [SampleRow(params, rng, (1,), list(out))], logprobs_mode="processed")
        out.append(int(toks[0]))
        lps.append(rec[0])
    assert list(got.token_ids) == out[1:]
    assert got.logprobs == tuple(lps)


def test_min_tokens_masks_eos_at_the_right_positions():
    # EOS (0) is the argmax everywhere; min_tokens = 3 with 1 output so far: masked at positions 0, 1
    logits = np.tile(np.array([9, 1, 2, 3, 4, 5, 6, 7], np.float32), (3, 1))
    row = SampleRow(SamplingParams(min_tokens=3, max_new_tokens=8), None, (1,), [4])
    got = verify(logits, [7, 7], row, eos_token_ids=(0,))
    assert got.token_ids == (7, 7, 0)  # position 2: two more outputs, min_tokens reached -> EOS


def _chi_square(counts, probs, n):
    expected = probs * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)]
)
@pytest.mark.parametrize("draft", [2, 6])
def test_the_rejection_rule_samples_the_target_distribution(params, draft):
    """First emitted token over 20k fixed-seed trials against p (chi-square, p-value > 0.001).
    Critical values at 0.001: dof 7 -> 24.32, dof 4 -> 18.47, dof 3 -> 16.27, dof 2 -> 13.82."""
    logits = np.array([[2.0, 1.5, 1.0, 0.5, 0.2, -0.5, 0.3, -1.0], [0.0] * V], np.float32)
    ids, probs = filtered_distribution(logits[0], params)
    p = np.zeros(V)
    p[ids] = probs
    rng = np.random.default_rng(1234)
    n = 20000
    counts = np.zeros(V)
    for _ in range(n):
        counts[accept_sampled(logits, [draft], params, rng)[0]] += 1
    stat, dof = _chi_square(counts, p, n)
    critical = {7: 24.32, 6: 22.46, 5: 20.52, 4: 18.47, 3: 16.27, 2: 13.82, 1: 10.83}[dof]
    assert stat < critical, (stat, dof, counts, p * n)
    # and the acceptance rate of the draft is p(draft)
    acc = sum(1 for _ in range(4000) if len(accept_sampled(logits, [draft], params, rng)) == 2) / 4000
    assert abs(acc - p[draft]) < 4 * np.sqrt(max(p[draft] * (1 - p[draft]), 1e-4) / 4000) + 1e-3


def test_the_second_token_is_the_targets_given_the_first():
    """Two positions: the pair (x1, x2) is distributed as p1(x1) p2(x2) (the proposal is (3, 3))."""
    params = SamplingParams(temperature=1.0)
    logits = np.array([[1.0, 0.0, 0.5, 1.2, 0, 0, 0, 0], [0.3, 1.0, 0.0, 0.8, 0, 0, 0, 0], [0] * V], np.float32)
    p1, p2 = (np.exp(row) / np.exp(row).sum() for row in logits[:2].astype(np.float64))
    rng = np.random.default_rng(7)
    n = 20000
    pairs = np.zeros((V, V))
    for _ in range(n):
        out = accept_sampled(logits, [3, 3], params, rng)
        if len(out) == 1:  # rejected at the first position: draw the second as plain decode would
            out.append(int(rng.choice(V, p=p2)))
        pairs[out[0], out[1]] += 1
    stat, dof = _chi_square(pairs.ravel(), np.outer(p1, p2).ravel(), n)
    assert stat < 63 + 3.1 * np.sqrt(2 * 63), (stat, dof)  # dof 63: mean + ~3 sd (p ~ 0.002)


def test_a_seeded_request_reproduces_its_speculative_tokens():
    params = SamplingParams(temperature=0.8, seed=3)
    logits = np.random.default_rng(0).normal(size=(4, V)).astype(np.float32)
    runs = [verify(logits, [1, 2, 3], SampleRow(params, make_generator(params), (1,), [])).token_ids for _ in range(2)]
    assert runs[0] == runs[1]
