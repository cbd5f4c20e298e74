"""Speculative decoding's pure pieces: n-gram proposals on hand-made sequences, the config's
checks, and the sizing of k from a cost table (hand-computed expectations)."""

import pytest

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.speculative.config import SpeculativeConfig
from trtpipe.runtime.speculative.cost import VerifyCost
from trtpipe.runtime.speculative.ngram import NgramIndex
from trtpipe.runtime.speculative.sizing import draft_lengths, expected_tokens


def test_the_longest_suffix_match_proposes_its_continuation():
    # a b c d a b c: the suffix (a b c) occurred at 0..2, continued by d a b c
    idx = NgramIndex(2, 3, [1, 2, 3, 4, 1, 2, 3])
    assert idx.propose(2) == ((4, 1), 3)
    assert idx.propose(10) == ((4, 1, 2, 3), 3)  # clipped at the context's end
    assert idx.propose(0) == ((), 0)


def test_the_latest_occurrence_wins_and_shorter_ngrams_are_the_fallback():
    # (5 6) occurs twice: continued by 7, then by 8 (latest); suffix (9 5 6) never occurred -> n = 2
    idx = NgramIndex(2, 3, [5, 6, 7, 5, 6, 8, 9, 5, 6])
    assert idx.propose(3) == ((8, 9, 5), 2)
    # below min_n nothing matches: the last token 6 alone occurred before, but min_n = 2
    assert NgramIndex(2, 3, [6, 1, 2, 6]).propose(2) == ((), 0)
    assert NgramIndex(1, 3, [6, 1, 2, 6]).propose(2) == ((1, 2), 1)


def test_the_suffix_never_matches_itself_and_no_match_is_empty():
    assert NgramIndex(2, 4, [1, 2, 3, 4]).propose(4) == ((), 0)
    assert NgramIndex(2, 4, []).propose(4) == ((), 0)
    assert NgramIndex(1, 1, [7, 7]).propose(3) == ((7,), 1)  # "7 7": 7 was continued by 7


def test_the_index_grows_incrementally_like_one_built_at_once():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    grown = NgramIndex(1, 3)
    for i in range(len(seq)):
        grown.sync(tuple(seq[:5]), seq[5 : i + 1]) if i >= 5 else grown.extend([seq[i]])
        assert grown.propose(3) == NgramIndex(1, 3, seq[: i + 1]).propose(3)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"method": "eagle"}, "method"),
        ({"max_k": 0}, "max_k"),
        ({"min_n": 3, "max_n": 2}, "min_n"),
        ({"max_n": True}, "max_n"),
    ],
)
def test_bad_configs_name_the_field(kw, field):
    with pytest.raises(RequestError, match=f"speculative.{field}") as e:
        SpeculativeConfig(**kw)
    assert e.value.field == f"speculative.{field}" and "Fix" in str(e.value)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == 1 + 0.5 + 0.25 + 0.125


def test_k_maximizes_expected_tokens_per_second():
    # the precondition's table (Zen 4, native): decode 1.0; 2 tokens 1.06x, 3: 1.20x, 5: 1.74x
    cost = {1: 1.0, 2: 1.06, 3: 1.20, 4: 1.47, 5: 1.74, 6: 1.9}
    # alpha 0.9: E/c = 1 | 1.9/1.06 = 1.79 | 2.71/1.20 = 2.26 | 3.44/1.47 = 2.34 | 4.10/1.74 = 2.36 -> k = 4
    assert draft_lengths([(0.9, 4)], cost.__getitem__, 1) == [4]
    # alpha 0.5: 1 | 1.5/1.06 = 1.415 | 1.75/1.2 = 1.458 | 1.875/1.47 = 1.276 -> k = 2
    assert draft_lengths([(0.5, 4)], cost.__getitem__, 1) == [2]
    # alpha 0.05: 1.05/1.06 < 1 -> plain decode
    assert draft_lengths([(0.05, 4)], cost.__getitem__, 1) == [0]
    # no proposal, nothing to size
    assert draft_lengths([(0.9, 0)], cost.__getitem__, 1) == [0]


def test_in_a_batch_the_likelier_row_gets_the_tokens():
    cost = {n: 1.0 + 0.1 * (n - 2) for n in range(2, 12)}
    # base 2 rows (1.0); gains 0.9, 0.81, 0.73 (row 0) beat 0.3 (row 1): each adds 0.1 to the cost
    ks = draft_lengths([(0.9, 3), (0.3, 3)], cost.__getitem__, 2)
    assert ks[0] == 3 and ks[1] <= 1


def test_verify_cost_interpolates_and_extends_its_table():
    c = VerifyCost(decode_s=0.004, chunk_s=(0.004, 0.005, 0.006, 0.007))
    assert c.chunk_time_s(3) == 0.006
    assert c.chunk_time_s(6) == pytest.approx(0.007 + 2 * 0.001)  # slope of the table's second half
    assert c.step_s(1, 0) == 0.004 and c.step_s(0, 3) == 0.006 and c.step_s(1, 3) == 0.007
    split = VerifyCost(decode_s=0.004, chunk_s=(0.004, 0.005, 0.006, 0.007), fused=False)
    assert split.step_s(1, 3) == pytest.approx(0.004 + 0.006)  # a decode call + a prefill call
    assert c.ratios() == "1: 1.00x, 2: 1.25x, 3: 1.50x, 4: 1.75x"


def test_a_proposal_that_never_pays_is_explored_with_one_token_and_learns():
    from types import SimpleNamespace

    from trtpipe.runtime.speculative.config import SpeculativeConfig
    from trtpipe.runtime.speculative.speculator import EXPLORE_AFTER_STEPS, NgramSpeculator

    # a busy start's table: a 2-token verify 1.6x a decode step, so at the prior 0.5 no k pays
    # (k = 1: 1.5 tokens for 1.6x; k = 4: 1.94 for 2.5x)
    cost = VerifyCost(decode_s=0.004, chunk_s=(0.004, 0.0064, 0.008, 0.009, 0.010))
    spec = NgramSpeculator(SpeculativeConfig(max_k=4, min_n=1, max_n=3), cost)
    req = SimpleNamespace(request_id="r", prompt_token_ids=[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], output_token_ids=[])
    steps = [spec.propose([req], [4]) for _ in range(EXPLORE_AFTER_STEPS)]
    assert steps[:-1] == [{}] * (EXPLORE_AFTER_STEPS - 1)  # nothing pays ...
    assert steps[-1] == {"r": (4,)}  # ... until one token is verified to learn
    spec.on_verified("r", 1, 1)  # the text repeats: accepted
    # the estimate is now (1 + 2 * 2/3) / 3 = 0.78: one token pays (1.78 tokens for 1.6x)
    assert spec.alpha("r") > 0.75
    assert spec.propose([req], [4])["r"][:1] == (4,)
