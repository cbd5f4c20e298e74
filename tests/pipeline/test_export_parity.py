"""Exported + lowered graphs in ONNX Runtime against the torch reference and transformers, on
the real SmolLM2-135M GGUF (issue: export parity).

Two test artifacts are built once per session (fp32 both phases; INT4 both phases with
``ort_accuracy_level: 0`` so MatMulNBits keeps fp32 activations and matches the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRANCE_ANSWER_IDS, FRANCE_PROMPT

pytestmark = pytest.mark.slow

OTHER_PROMPTS = [
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Translate 'good morning' into French.",
]
ORDINARY_TEXT = (
    "The history of the bicycle began in the early nineteenth century, when inventors in Europe "
    "experimented with two-wheeled machines that riders pushed along with their feet. Over the "
    "following decades, pedals, chains and air-filled tyres turned the bicycle into a practical "
    "means of transport. Cities built paths for cyclists, factories produced millions of frames, "
    "and the bicycle became a symbol of independence for workers and students alike. Today, "
    "bicycles are used for commuting, sport and recreation all over the world, and engineers "
    "continue to improve them with lighter materials, better brakes and electric motors that help "
    "riders climb steep hills. Many people believe that cycling can reduce traffic, improve "
    "public health and lower the pollution that cars produce in crowded cities. Governments in "
    "several countries now offer money to people who buy bicycles, and some companies let their "
    "employees borrow bicycles for free. In the countryside, long-distance cyclists travel from "
    "village to village, carrying tents and food in bags attached to their frames, and they often "
    "say that the slow pace lets them see the landscape in a way that drivers never can."
)


def forced_logits(llm, prompt_ids, target_ids):
    """Engine logits with teacher forcing: prefill ``prompt_ids`` (one chunk), then one decode
    step per token of ``target_ids``. Returns [1 + len(target_ids), V] (row i predicts token i
    of the continuation)."""
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
    from trtpipe.runtime.sched.scheduler import ScheduledDecode, ScheduledPrefill

    kv = llm.kv_manager
    sid = "forced"
    n = len(prompt_ids)
    assert kv.allocate_slots(sid, n, 0)
    try:
        rec = ScheduledPrefill(
            sid, tuple(prompt_ids), 0, tuple(kv.block_table(sid)), tuple(kv.slot_mapping(sid, 0, n)), True
        )
        rows = [llm.engine.prefill(PrefillBatch.from_scheduled([rec]))[0]]
        for i, tok in enumerate(target_ids[:-1]):
            p = n + i
            assert kv.allocate_slots(sid, 1, p)
            d = ScheduledDecode(sid, int(tok), p, tuple(kv.block_table(sid)), kv.slot_mapping(sid, p, 1)[0])
            rows.append(llm.engine.decode(DecodeBatch.from_scheduled([d]))[0])
        return np.stack(rows)
    finally:
        kv.free(sid)


def _prompt_of(smollm2, n_tokens):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(smollm2.tokenizer_json)
    ids = tok.encode(ORDINARY_TEXT * 4).ids
    return ids[:n_tokens]


@pytest.mark.parametrize("prompt_len", [16, 128, 512])
def test_fp32_graphs_match_reference_logits(fp32_llm, smollm2, prompt_len):
    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.stages import reference_greedy

    ref = build_reference_model(smollm2, "fp32", rope_table_len=1024)
    prompt = _prompt_of(smollm2, prompt_len)
    ids, ref_logits = reference_greedy(ref, prompt, 32)
    got = forced_logits(fp32_llm, prompt, ids)
    diff = float(np.abs(got - np.stack(ref_logits)).max())
    print(f"fp32 ORT vs torch reference, prompt {prompt_len} + 32 decode steps: max |dlogit| = {diff:.2e}")
    assert diff <= 1e-3


def test_fp32_greedy_matches_transformers(fp32_llm, hf_smollm2, france_ids):
    import torch

    from trtpipe.runtime.sample.params import SamplingParams

    tok, hf = hf_smollm2
    prompts = [FRANCE_PROMPT] + OTHER_PROMPTS
    outs = fp32_llm.generate(prompts, SamplingParams(max_new_tokens=32), chat=True)
    assert outs[0].prompt_token_ids == tuple(france_ids)
    assert outs[0].output_token_ids == FRANCE_ANSWER_IDS
    for out in outs:
        with torch.no_grad():
            want = hf.generate(torch.tensor([list(out.prompt_token_ids)]), max_new_tokens=32, do_sample=False)
        want = want[0, len(out.prompt_token_ids) :].tolist()
        assert out.output_token_ids == want[: len(out.output_token_ids)], out.text


def test_int4_greedy_matches_int4_reference(int4_llm, smollm2):
    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.stages import reference_greedy
    from trtpipe.runtime.sample.params import SamplingParams

    ref = build_reference_model(smollm2, "int4", 32, False, rope_table_len=1024)
    prompts = [FRANCE_PROMPT] + OTHER_PROMPTS[:2]
    outs = int4_llm.generate(prompts, SamplingParams(max_new_tokens=32), chat=True)
    for out in outs:
        want, _ = reference_greedy(ref, list(out.prompt_token_ids), 32, eos={2})
        assert out.output_token_ids == want, out.text


def test_int4_teacher_forced_agreement_with_fp32_reference(int4_llm, ref_fp32, smollm2):
    import torch

    ids = _prompt_of(smollm2, 257)
    with torch.no_grad():
        want = ref_fp32.forward_dense(torch.tensor([ids]))[0].numpy().argmax(-1)  # predicts ids[1:]
    got = forced_logits(int4_llm, ids[:1], ids[1:257]).argmax(-1)
    agreement = float((got[:256] == want[:256]).mean())
    print(f"INT4 (exact Q4_1) teacher-forced next-token agreement with fp32 reference over 256 tokens: {agreement:.4f}")
    assert agreement >= 0.97
