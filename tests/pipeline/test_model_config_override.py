"""with_sliding_window: the recipe's sliding_window over a model's per-layer windows (one home for
the override that build, golden, estimate and the reference model apply)."""

from __future__ import annotations

import pytest

from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.runtime.artifact.model_config import ModelConfig

# A Qwen2-style model: window 8 on layer 1 only, different kv heads per layer.
CONFIG = ModelConfig(
    architecture="qwen2",
    num_layers=3,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    vocab_size=128,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    layer_num_kv_heads=(2, 1, 2),
    layer_sliding_window=(0, 8, 0),
    eos_token_ids=(2, 5),
    name="tiny",
)


def test_none_keeps_the_models_windows():
    assert with_sliding_window(CONFIG, None) is CONFIG
    assert CONFIG.layer_sliding_window == (0, 8, 0)


@pytest.mark.parametrize(("window", "expected"), [(0, (0, 0, 0)), (16, (16, 16, 16)), (8, (8, 8, 8))])
def test_a_window_applies_to_every_layer_and_nothing_else(window, expected):
    out = with_sliding_window(CONFIG, window)
    assert out.layer_sliding_window == expected
    assert CONFIG.layer_sliding_window == (0, 8, 0)  # the input is not changed
    same = {f: getattr(CONFIG, f) for f in CONFIG.to_dict() if f != "layer_sliding_window"}
    assert {f: getattr(out, f) for f in same} == same


@pytest.mark.parametrize("bad", [-1, 2.5, "8", True])
def test_bad_window_names_the_value(bad):
    with pytest.raises(ValueError, match=rf"sliding_window = {bad!r}"):
        with_sliding_window(CONFIG, bad)
