"""Teacher forcing: exact agreement counts, chunked prefill records, blocks freed (also on error)
on a fake engine; then on the real artifact against its golden outputs (slow)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.reference_outputs import assert_follows_reference
from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.measure.teacher_forcing import first_mismatch, greedy_ids, teacher_forced_agreement

V = 50


class CountingEngine:
    """Predicts "last input token + 1" (one-hot logits [S, V]); records every batch."""

    def __init__(self, fail_at_decode: int | None = None):
        self.prefills, self.decodes = [], []
        self.fail_at_decode = fail_at_decode

    @staticmethod
    def _onehot(tokens):
        logits = np.zeros((len(tokens), V), np.float32)
        logits[np.arange(len(tokens)), (np.asarray(tokens) + 1) % V] = 1.0
        return logits

    def prefill(self, batch):
        self.prefills.append(batch)
        return self._onehot(batch.input_ids[batch.last_token_indices])

    def decode(self, batch):
        if self.fail_at_decode is not None and len(self.decodes) == self.fail_at_decode:
            raise RuntimeError("engine failure")
        self.decodes.append(batch)
        return self._onehot(batch.input_ids)


def fake_llm(engine, max_num_tokens=4, max_seq_len=64, block_size=4, num_blocks=32):
    pool = BlockPool(num_blocks)
    return SimpleNamespace(
        engine=engine,
        block_pool=pool,
        kv_manager=KVCacheManager(pool, block_size),
        manifest=SimpleNamespace(limits=SimpleNamespace(max_seq_len=max_seq_len, max_num_tokens=max_num_tokens)),
    )


def test_perfect_agreement_and_predictions():
    llm = fake_llm(CountingEngine())
    agree, preds = teacher_forced_agreement(llm, [1, 2, 3], [4, 5, 6, 7])
    assert agree == 1.0
    assert preds == [4, 5, 6, 7]
    assert llm.block_pool.num_used == 0


def test_disagreement_is_counted_per_position_without_derailing():
    llm = fake_llm(CountingEngine())
    # Target 9 at position 1 is wrong (model says 5), but teacher forcing feeds 9, so the model
    # then predicts 10, matching the target again.
    agree, preds = teacher_forced_agreement(llm, [1, 2, 3], [4, 9, 10, 12])
    assert preds == [4, 5, 10, 11]
    assert agree == pytest.approx(2 / 4)


def test_prefill_chunked_by_max_num_tokens_then_one_decode_per_fed_token():
    eng = CountingEngine()
    llm = fake_llm(eng, max_num_tokens=4, block_size=4)
    teacher_forced_agreement(llm, list(range(10, 20)), [20, 21, 22])
    assert [b.input_ids.tolist() for b in eng.prefills] == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19]]
    assert [b.positions.tolist() for b in eng.prefills] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.context_lens.tolist() for b in eng.prefills] == [[4], [8], [10]]
    # Fresh pool: blocks 1, 2, 3 in order; slot = block * 4 + pos % 4.
    assert eng.prefills[0].slot_mapping.tolist() == [4, 5, 6, 7]
    assert eng.prefills[2].slot_mapping.tolist() == [12, 13]
    assert eng.prefills[2].block_tables.tolist() == [[1, 2, 3]]
    # The last target token is never fed: 2 decodes for 3 targets, at positions 10 and 11.
    assert [b.input_ids.tolist() for b in eng.decodes] == [[20], [21]]
    assert [b.positions.tolist() for b in eng.decodes] == [[10], [11]]
    assert [b.slot_mapping.tolist() for b in eng.decodes] == [[14], [15]]
    assert llm.block_pool.num_used == 0


def test_blocks_freed_on_engine_error():
    llm = fake_llm(CountingEngine(fail_at_decode=1))
    with pytest.raises(RuntimeError, match="engine failure"):
        teacher_forced_agreement(llm, [1, 2, 3, 4, 5], [6, 7, 8, 9])
    assert llm.block_pool.num_used == 0
    assert llm.kv_manager.num_seqs == 0


def test_bad_inputs_raise_request_error():
    llm = fake_llm(CountingEngine(), max_seq_len=8)
    with pytest.raises(RequestError, match="non-empty"):
        teacher_forced_agreement(llm, [], [1])
    with pytest.raises(RequestError, match="non-empty"):
        teacher_forced_agreement(llm, [1], [])
    with pytest.raises(RequestError, match="max_seq_len 8"):
        teacher_forced_agreement(llm, [1] * 6, [2, 3, 4, 5])
    full = fake_llm(CountingEngine(), num_blocks=3, block_size=4)  # 2 usable blocks = 8 tokens
    with pytest.raises(RequestError, match="no room"):
        teacher_forced_agreement(full, [1] * 6, [2, 3, 4, 5, 6])
    assert full.block_pool.num_used == 0


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 5, 3], [1, 2, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2
    assert first_mismatch([], [7]) == 0


# ---------------------------------------------------------------------------------------------
# The real artifact (prefill fp32, decode int4)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(default_artifact):
    from trtpipe.runtime.llm import LLM

    golden = json.loads((default_artifact / "golden.json").read_text())
    return LLM(default_artifact), golden["sequences"]


@pytest.mark.slow
def test_real_teacher_forced_agreement_with_golden(real):
    llm, seqs = real
    s = seqs[1]  # the Fibonacci prompt: 64 tokens, long enough to mean something
    agree, preds = teacher_forced_agreement(llm, s["prompt_ids"], s["output_ids"])
    assert len(preds) == len(s["output_ids"])
    assert preds[0] == s["output_ids"][0]  # the fp32 prefill makes the first prediction
    assert agree >= 0.9
    assert llm.block_pool.num_used == 0


@pytest.mark.slow
def test_real_teacher_forcing_matches_greedy_where_greedy_agrees(real):
    llm, seqs = real
    s = seqs[0]  # "What is the capital of France?": 8 tokens ending in EOS
    got = greedy_ids(llm, s["prompt_ids"], len(s["output_ids"]))
    agree, preds = teacher_forced_agreement(llm, s["prompt_ids"], got)
    # Feeding the engine its own greedy output must reproduce it exactly (same engines, same KV).
    assert preds == got and agree == 1.0
    assert_follows_reference(got, s)
    assert llm.block_pool.num_used == 0
