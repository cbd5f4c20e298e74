"""The torch reference on the real SmolLM2-135M GGUF against transformers' own GGUF load."""

import numpy as np
import pytest
import torch
from conftest import FRANCE_ANSWER_IDS

pytestmark = pytest.mark.slow


def _greedy(logits_fn, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(logits_fn(ids)))
        out.append(nxt)
        ids.append(nxt)
        if nxt == 2:
            break
    return out


def test_config_facts(smollm2):
    c = smollm2.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (1536, 49152, 8192)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings and c.eos_token_ids == (2,)
    assert smollm2.weights["model.layers.0.mlp.down_proj.weight"].qtype == "Q4_1"
    assert smollm2.weights["model.embed_tokens.weight"].qtype == "Q8_0"


def test_prompt_is_37_tokens(france_ids):
    assert len(france_ids) == 37


def test_logits_match_transformers(ref_fp32, hf_smollm2, france_ids):
    _, hf = hf_smollm2
    ids = torch.tensor([france_ids])
    with torch.no_grad():
        want = hf(ids).logits[0].numpy()
    got = ref_fp32.forward_dense(ids)[0].numpy()
    diff = float(np.abs(got - want).max())
    print(f"max |logit diff| vs transformers over {len(france_ids)} positions: {diff:.2e}")
    assert diff <= 1e-3


def test_greedy_32_matches_transformers(ref_fp32, hf_smollm2, france_ids):
    _, hf = hf_smollm2
    ours = _greedy(lambda ids: ref_fp32.forward_dense(torch.tensor([ids]))[0, -1].numpy(), france_ids, 32)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([france_ids]), max_new_tokens=32, do_sample=False)[
            0, len(france_ids) :
        ].tolist()
    assert ours[: len(FRANCE_ANSWER_IDS)] == FRANCE_ANSWER_IDS
    assert ours == theirs[: len(ours)]
