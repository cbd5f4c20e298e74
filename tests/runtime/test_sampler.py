"""Sampler (greedy, temperature, top-k, top-p, seeds) and SamplingParams validation."""

import numpy as np
import pytest

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sample.sampler import make_generator, sample

V = 50


def logits_batch(rows=4, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, V)).astype(np.float32) * 3


def test_greedy_is_argmax_without_touching_the_generator():
    logits = logits_batch()
    rng = np.random.default_rng(1)
    state = rng.bit_generator.state
    out = sample(logits, [SamplingParams()] * 4, [rng] * 4)
    assert out.dtype == np.int64 and out.shape == (4,)
    np.testing.assert_array_equal(out, logits.argmax(-1))
    assert rng.bit_generator.state == state


def test_top_k_1_and_tiny_top_p_are_argmax():
    logits = logits_batch(6)
    params = [SamplingParams(temperature=1.5, top_k=1)] * 3 + [SamplingParams(temperature=1.5, top_p=1e-6)] * 3
    out = sample(logits, params, [np.random.default_rng(i) for i in range(6)])
    np.testing.assert_array_equal(out, logits.argmax(-1))


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    logits = logits_batch(3)
    p = SamplingParams(temperature=1.0, seed=1234)
    a = [sample(logits[:1], [p], [g])[0] for g in [make_generator(p)] for _ in range(20)]
    g2 = make_generator(p)
    b = [sample(logits, [p, SamplingParams(), SamplingParams(temperature=0.7)], [g2, None, None])[0] for _ in range(20)]
    assert a == b
    assert len(set(a)) > 1  # it really samples


def test_top_k_keeps_only_the_k_best():
    logits = logits_batch(1)
    top5 = set(np.argsort(logits[0])[-5:])
    p = SamplingParams(temperature=5.0, top_k=5)
    rng = np.random.default_rng(0)
    seen = {int(sample(logits, [p], [rng])[0]) for _ in range(300)}
    assert seen <= top5 and len(seen) >= 3


def test_top_p_keeps_the_smallest_set_with_enough_mass():
    # probs 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps {0, 1} (0.5 < 0.75 <= 0.8); 0.85 also keeps 2.
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    rng = np.random.default_rng(0)
    seen = {int(sample(logits, [SamplingParams(temperature=1.0, top_p=0.75)], [rng])[0]) for _ in range(300)}
    assert seen == {0, 1}
    seen = {int(sample(logits, [SamplingParams(temperature=1.0, top_p=0.85)], [rng])[0]) for _ in range(300)}
    assert seen == {0, 1, 2}


def test_sampling_follows_the_distribution():
    probs = np.array([0.6, 0.3, 0.1])
    logits = np.log(probs)[None].astype(np.float32)
    rng = np.random.default_rng(7)
    draws = np.array([sample(logits, [SamplingParams(temperature=1.0)], [rng])[0] for _ in range(3000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_masked_tokens_are_never_sampled():
    logits = np.full((1, 8), -np.inf, dtype=np.float32)
    logits[0, 3] = 0.0
    logits[0, 5] = 0.0
    rng = np.random.default_rng(0)
    seen = {int(sample(logits, [SamplingParams(temperature=1.0, top_p=0.9)], [rng])[0]) for _ in range(100)}
    assert seen <= {3, 5}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
    ],
)
def test_validation_names_field_value_expectation_and_fix(kwargs, field):
    with pytest.raises(RequestError) as info:
        SamplingParams(**kwargs).validate()
    msg = str(info.value)
    assert f"SamplingParams.{field} = " in msg and "expected" in msg and "fix:" in msg
    assert isinstance(info.value, ValueError)


def test_valid_params_and_list_coercion():
    p = SamplingParams(max_new_tokens=1, temperature=0.7, top_k=40, top_p=0.9, seed=0, stop=["\n"], stop_token_ids=[2])
    assert p.validate() is p
    assert p.stop == ("\n",) and p.stop_token_ids == (2,)
    assert SamplingParams(stop="END").stop == ("END",)
    assert SamplingParams().is_greedy and not p.is_greedy


def _hf_reference(scores, temperature, top_k, top_p):
    """Hugging Face TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper, in NumPy."""
    scores = scores.astype(np.float64) / temperature
    if top_k > 0:
        kth = np.sort(scores)[-min(top_k, scores.size)]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p < 1.0:
        idx = np.argsort(scores, kind="stable")
        sorted_scores = scores[idx]
        probs = np.exp(sorted_scores - sorted_scores.max())
        cum = np.cumsum(probs / probs.sum())
        remove = cum <= 1 - top_p
        remove[-1] = False
        scores = scores.copy()
        scores[idx[remove]] = -np.inf
    probs = np.exp(scores - scores.max())
    return probs / probs.sum()


@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (7, 1.0, 0.5), (0, 0.6, 1.3), (12, 0.9, 0.8)])
def test_filtered_distribution_matches_hf_warpers(top_k, top_p, temperature):
    from trtpipe.runtime.sample.sampler import filtered_distribution

    for row in logits_batch(5, seed=top_k):
        ids, probs = filtered_distribution(row, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
        full = np.zeros(V)
        full[ids] = probs
        np.testing.assert_allclose(full, _hf_reference(row, temperature, top_k, top_p), atol=1e-12)
        assert np.all(np.diff(ids) > 0)
