"""Prefix caching on real engines: greedy outputs with the cache == without it, on SmolLM2
(INT4, full attention) and on a tiny random Mistral whose sliding window (8) is shorter than the
shared prefix, built through the same pipeline (ONNX Runtime, CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _run(llm, prompts, max_new, salts=None, staggered=True):
    """Add requests a few per step (so later ones arrive while earlier ones run); outputs by index."""
    from trtpipe.runtime.sample.params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    salts = salts or [None] * len(prompts)
    pending = list(range(len(prompts)))
    rid_of, outs = {}, {}
    while pending or llm.has_unfinished():
        for i in pending[: 2 if staggered else len(pending)]:
            rid_of[llm.add_request(list(prompts[i]), params, cache_salt=salts[i])] = i
        pending = pending[2 if staggered else len(pending) :]
        for o in llm.step():
            outs[rid_of[o.request_id]] = o
    assert llm.block_pool.num_used == 0
    return [outs[i] for i in range(len(prompts))]


def test_smollm2_shared_system_prompt_same_outputs_with_and_without_cache(int4_artifact):
    from trtpipe.runtime.llm import LLM

    on = LLM(int4_artifact, prefix_caching=True)
    off = LLM(int4_artifact, prefix_caching=False)
    tok = on.tokenizer
    system = tok.encode("You are a helpful assistant for a bakery. Answer briefly and politely. " * 6)
    users = [
        "What time do you open?",
        "Do you sell rye bread?",
        "Is there parking?",
        "Can I order a cake for Sunday?",
        "Do you have gluten-free options?",
        "Where are you?",
    ]
    prompts = [system + tok.encode(" Question: " + u + " Answer:", add_special_tokens=False) for u in users]
    assert len(system) > 64  # several full 16-token blocks shared
    got = _run(on, prompts, 12)
    want = _run(off, prompts, 12)
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in want]
    cached = [o.cached_tokens for o in got]
    assert cached[0] == 0 and all(c >= (len(system) // 16 - 1) * 16 for c in cached[2:]), cached
    assert all(o.cached_tokens == 0 for o in want)
    assert on.prefix_cache_hits == sum(cached) and on.prefix_cache_queries == sum(len(p) for p in prompts)
    assert off.prefix_cache_queries == 0
    # Another salt: no hit, same tokens.
    (salted,) = _run(on, prompts[:1], 12, salts=["tenant-b"])
    assert salted.cached_tokens == 0 and salted.output_token_ids == want[0].output_token_ids


# ---- tiny sliding-window Mistral -----------------------------------------------------------

VOCAB = 128


def _tiny_mistral_dir(path):
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        sliding_window=8,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(3)
    model = transformers.MistralForCausalLM(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def mistral_window_artifact(tmp_path_factory):
    from trtpipe.pipeline.recipe import parse_recipe
    from trtpipe.pipeline.stages import build

    src = _tiny_mistral_dir(tmp_path_factory.mktemp("tiny-mistral"))
    root = tmp_path_factory.mktemp("artifacts")
    recipe = parse_recipe(
        {
            "name": "tiny-mistral-window",
            "model": {"source": str(src)},
            "target": "cpu",
            "precision": {"prefill": "fp32", "decode": "fp32"},
            "kv_cache": {"block_size": 4, "num_blocks": 40},
            "max_seq_len": 96,
            "max_batch_size": 4,
            "max_num_tokens": 32,
        },
        origin="tiny.yaml",
        base_dir=root,
    )
    res = build(recipe, root, golden=False, log=lambda s: None)
    m = json.loads((res.artifact_dir / "manifest.json").read_text())
    assert m["kv"]["sliding_window"] == 8
    return res.artifact_dir


def test_sliding_window_model_same_outputs_with_and_without_cache(mistral_window_artifact):
    """Shared prefixes of 20-40 tokens (window 8, block 4): hits skip blocks the window released
    (null in the table) and share the ones it still needs; outputs equal the uncached run."""
    from trtpipe.runtime.llm import LLM

    rng = np.random.default_rng(0)
    shared = [list(rng.integers(3, VOCAB, 40)) for _ in range(2)]
    prompts = [shared[i % 2][: 20 + (i * 7) % 21] + list(rng.integers(3, VOCAB, 1 + i % 5)) for i in range(12)]
    on = LLM(mistral_window_artifact, prefix_caching=True)
    off = LLM(mistral_window_artifact, prefix_caching=False)
    got = _run(on, prompts, 10)
    want = _run(off, prompts, 10)
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in want]
    assert sum(o.cached_tokens for o in got) >= 100  # most shared blocks were hits
    assert on.kv_manager.sliding_window == 8
