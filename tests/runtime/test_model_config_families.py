"""ModelConfig's family fields (issue 42): Llama defaults, so a manifest written before they
existed reads back with the same meaning; round trip through to_dict / from_dict (JSON); the
per-layer RoPE accessor; validation messages; the features an engine must refuse by name."""

from __future__ import annotations

import json

import pytest

from trtpipe.runtime.artifact.model_config import FAMILY_FIELDS, ModelConfig, RopeScaling

LLAMA = ModelConfig(
    architecture="llama",
    num_layers=3,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    vocab_size=128,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    eos_token_ids=(2,),
)
GEMMA3 = ModelConfig(
    architecture="gemma3",
    num_layers=3,
    hidden_size=640,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    intermediate_size=2048,
    vocab_size=262144,
    max_position_embeddings=32768,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    rope_scaling=RopeScaling("linear", 8.0),
    layer_sliding_window=(512, 512, 0),
    layer_rope_theta=(1e4, 1e4, 1e6),
    layer_rope_scaled=(False, False, True),
    norm_layout="sandwich",
    qk_norm=True,
    activation="gelu_tanh",
    embedding_scale=640**0.5,
    attention_scale=256**-0.5,
    final_logit_softcap=30.0,
)
# A Llama manifest's "model" entry as written before the family fields existed (issue 42).
OLD_MANIFEST_MODEL = {
    "architecture": "llama",
    "num_layers": 3,
    "hidden_size": 64,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "rope_scaling": None,
    "layer_num_kv_heads": [2, 2, 2],
    "layer_sliding_window": [0, 0, 0],
    "bos_token_id": None,
    "eos_token_ids": [2],
    "chat_template": None,
    "name": "",
    "extra": {},
}


def test_an_old_manifest_reads_as_the_llama_it_was():
    c = ModelConfig.from_dict(OLD_MANIFEST_MODEL)
    assert c == LLAMA
    assert (c.norm_layout, c.norm_weight_offset, c.qk_norm, c.activation) == ("pre", 0.0, False, "silu")
    assert (c.embedding_scale, c.attn_logit_softcap, c.final_logit_softcap) == (1.0, 0.0, 0.0)
    assert c.softmax_scale == 0.25  # 16 ** -0.5
    assert [c.layer_rope(i) for i in range(3)] == [(10000.0, True)] * 3
    assert c.non_llama_features() == ()
    # what a new manifest adds for a Llama: the family fields at their defaults, nothing else changed
    d = LLAMA.to_dict()
    assert {k: v for k, v in d.items() if k not in FAMILY_FIELDS} == {
        **OLD_MANIFEST_MODEL,
        "layer_num_kv_heads": (2, 2, 2),
        "layer_sliding_window": (0, 0, 0),
        "eos_token_ids": (2,),
    }
    assert set(d) - set(OLD_MANIFEST_MODEL) == set(FAMILY_FIELDS)


def test_gemma3_round_trips_through_json():
    back = ModelConfig.from_dict(json.loads(json.dumps(GEMMA3.to_dict())))
    assert back == GEMMA3
    assert back.layer_rope_theta == (1e4, 1e4, 1e6) and back.layer_rope_scaled == (False, False, True)
    assert [back.layer_rope(i) for i in range(3)] == [(1e4, False), (1e4, False), (1e6, True)]
    assert back.non_llama_features() == (
        "layer_rope_theta",
        "norm_layout",
        "qk_norm",
        "activation",
        "embedding_scale",
        "attention_scale",
        "final_logit_softcap",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("norm_layout", "post", r"norm_layout = 'post'; expected one of \('pre', 'sandwich'\)"),
        ("activation", "relu", r"activation = 'relu'; expected one of \('silu', 'gelu_tanh'\)"),
        ("layer_rope_theta", (1e4, 1e6), r"layer_rope_theta has 2 entries; expected 0 or num_layers = 3"),
        ("attn_logit_softcap", -1.0, r"attn_logit_softcap = -1.0; expected >= 0"),
    ],
)
def test_bad_family_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**OLD_MANIFEST_MODEL, field: value})
