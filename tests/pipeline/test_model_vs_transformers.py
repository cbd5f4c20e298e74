"""The torch reference model against transformers (the oracle) on tiny random checkpoints.

Each config is created here, saved to a temp folder with safetensors, loaded through our
Hugging Face loader, and compared in fp32: max |logit difference| <= 1e-4, prompts longer than
the sliding window.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from trtpipe.pipeline.model.hf import load_hf_folder  # noqa: E402
from trtpipe.pipeline.model.reference import build_reference_model  # noqa: E402

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def _save(tmp_path, model):
    model.save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path


def _compare(tmp_path, hf_model, prompt_len=40, seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, BASE["vocab_size"], (2, prompt_len))
    with torch.no_grad():
        want = hf_model(ids).logits.float().numpy()
    loaded = load_hf_folder(_save(tmp_path, hf_model))
    ref = build_reference_model(loaded)
    got = ref.forward_dense(ids).numpy()
    return float(np.abs(got - want).max()), loaded


def _make(cls_name, cfg_name, **kw):
    cfg = getattr(transformers, cfg_name)(**{**BASE, **kw})
    torch.manual_seed(1)
    return getattr(transformers, cls_name)(cfg).eval()


def test_llama_matches_transformers(tmp_path):
    diff, loaded = _compare(tmp_path, _make("LlamaForCausalLM", "LlamaConfig", rope_theta=10000.0))
    assert loaded.config.architecture == "llama"
    assert diff <= 1e-4, diff


def test_llama_tied_embeddings(tmp_path):
    diff, loaded = _compare(tmp_path, _make("LlamaForCausalLM", "LlamaConfig", tie_word_embeddings=True))
    assert loaded.config.tie_word_embeddings
    assert diff <= 1e-4, diff


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_llama_rope_scaling(tmp_path, scaling):
    m = _make("LlamaForCausalLM", "LlamaConfig", rope_scaling=dict(scaling), rope_theta=10000.0)
    diff, loaded = _compare(tmp_path, m, prompt_len=120)
    assert loaded.config.rope_scaling.rope_type == scaling["rope_type"]
    assert diff <= 1e-4, diff


def test_mistral_sliding_window_shorter_than_prompt(tmp_path):
    m = _make("MistralForCausalLM", "MistralConfig", sliding_window=8)
    diff, loaded = _compare(tmp_path, m, prompt_len=40)
    assert loaded.config.layer_sliding_window == (8, 8)
    assert diff <= 1e-4, diff


def test_recipe_window_override_matches_transformers_windowed_model(tmp_path):
    """A Llama checkpoint (no window) built with the recipe's sliding_window = 8 must equal
    transformers' Mistral (same weights, sliding_window 8) on a 40-token prompt, and differ from
    the unwindowed Llama: the override reaches every layer's attention."""
    llama = _make("LlamaForCausalLM", "LlamaConfig", rope_theta=10000.0)
    mistral = _make("MistralForCausalLM", "MistralConfig", rope_theta=10000.0, sliding_window=8)
    mistral.load_state_dict(llama.state_dict())
    loaded = load_hf_folder(_save(tmp_path, llama))
    assert loaded.config.layer_sliding_window == (0, 0)
    ref = build_reference_model(loaded, sliding_window=8)
    assert ref.config.layer_sliding_window == (8, 8) and loaded.config.layer_sliding_window == (0, 0)
    assert [layer.self_attn.sliding_window for layer in ref.layers] == [8, 8]
    torch.manual_seed(0)
    ids = torch.randint(0, BASE["vocab_size"], (2, 40))
    with torch.no_grad():
        want = mistral(ids).logits.float().numpy()
        unwindowed = llama(ids).logits.float().numpy()
    got = ref.forward_dense(ids).numpy()
    assert float(np.abs(got - want).max()) <= 1e-4
    assert float(np.abs(got - unwindowed).max()) > 1e-2


def test_qwen2_bias_and_window(tmp_path):
    m = _make("Qwen2ForCausalLM", "Qwen2Config", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    diff, loaded = _compare(tmp_path, m, prompt_len=40)
    assert loaded.config.attention_bias
    assert loaded.config.layer_sliding_window == (0, 8)
    assert diff <= 1e-4, diff


def test_eos_ids_follow_generation_config(tmp_path):
    """generate() stops on generation_config.json's eos ids (Llama 3.1 style: several); the
    loaded config lists config.json's EOS first, then those, once each."""
    m = _make("LlamaForCausalLM", "LlamaConfig", eos_token_id=2)
    m.generation_config.eos_token_id = [2, 7, 9]
    _save(tmp_path, m)
    assert transformers.GenerationConfig.from_pretrained(tmp_path).eos_token_id == [2, 7, 9]
    assert load_hf_folder(tmp_path).config.eos_token_ids == (2, 7, 9)
    (tmp_path / "generation_config.json").unlink()
    assert load_hf_folder(tmp_path).config.eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text("{broken")
    from trtpipe.pipeline.model.gguf import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"generation_config\.json: eos_token_id could not be read"):
        load_hf_folder(tmp_path)


def test_unknown_rope_scaling_is_an_error(tmp_path):
    m = _make("LlamaForCausalLM", "LlamaConfig")
    _save(tmp_path, m)
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}
    cfg.pop("rope_parameters", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from trtpipe.pipeline.model.gguf import ModelLoadError

    with pytest.raises(ModelLoadError, match="yarn"):
        load_hf_folder(tmp_path)
