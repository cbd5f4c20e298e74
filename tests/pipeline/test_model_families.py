"""The reference model against transformers (the oracle) for the families beyond Llama (issue 42):
Gemma 3, Gemma 2 and Qwen 3, on tiny random checkpoints saved to a temp folder and loaded
through our Hugging Face loader (and, for Gemma 3, through a GGUF file written like llama.cpp's
convert). transformers runs with eager attention in fp32; tolerance: max |logit difference|
<= 1e-4 (the Llama tests' bound), on prompts longer than the sliding window.

Norm weights are randomized (transformers initializes Gemma's to 0, i.e. a multiplier of 1, which
would hide a wrong ``1 + w`` convention), and the scales that default to neutral values are set
to values that change the output (``query_pre_attn_scalar`` != head_dim, small soft-caps).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from trtpipe.pipeline.model.gguf import ModelLoadError  # noqa: E402
from trtpipe.pipeline.model.hf import load_hf_folder  # noqa: E402
from trtpipe.pipeline.model.reference import build_reference_model  # noqa: E402
from trtpipe.plugins.core.errors import OpError  # noqa: E402

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
PROMPT_LEN = 40  # > the window of 8
# transformers 5's per-layer-type RoPE: linear scaling on the global (full attention) layers only
LINEAR_ON_GLOBAL = {
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
}


def _make(cls_name: str, cfg_name: str, norm_center: float, **kw):
    """A tiny random model; norm weights ~ norm_center + N(0, 0.3), Q/K projections x 10 (random
    init's attention scores are ~1e-2: nearly uniform attention would hide window, RoPE and
    soft-cap errors)."""
    cfg = getattr(transformers, cfg_name)(**{**BASE, **kw})
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(norm_center + 0.3 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(10.0)
    return model


def _ids(seed: int = 0, length: int = PROMPT_LEN) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, BASE["vocab_size"], (2, length))


def _compare(tmp_path, hf_model):
    ids = _ids()
    with torch.no_grad():
        want = hf_model(ids).logits.float().numpy()
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_hf_folder(tmp_path)
    got = build_reference_model(loaded).forward_dense(ids).numpy()
    return float(np.abs(got - want).max()), loaded, want


def _gemma3(**kw):
    kw = copy.deepcopy(kw)  # transformers' config fills rope_parameters in place
    return _make("Gemma3ForCausalLM", "Gemma3TextConfig", 0.0, sliding_window=8, query_pre_attn_scalar=24, **kw)


def test_gemma3_matches_transformers(tmp_path):
    diff, loaded, _ = _compare(tmp_path, _gemma3(final_logit_softcapping=3.0))
    c = loaded.config
    assert c.architecture == "gemma3" and c.norm_layout == "sandwich" and c.qk_norm
    assert c.layer_sliding_window == (8, 8, 8, 8, 8, 0)  # (i + 1) % 6 != 0 slides
    assert c.layer_rope_theta == (1e4, 1e4, 1e4, 1e4, 1e4, 1e6)
    assert (c.norm_weight_offset, c.activation, c.final_logit_softcap) == (1.0, "gelu_tanh", 3.0)
    assert c.embedding_scale == pytest.approx(8.0) and c.softmax_scale == pytest.approx(24**-0.5)
    assert c.attn_logit_softcap == 0.0 and c.tie_word_embeddings
    assert diff <= 1e-4, diff


def test_gemma3_rope_scaling_on_global_layers_only(tmp_path):
    """rope_parameters per layer type (transformers 5): linear scaling on full attention only."""
    diff, loaded, _ = _compare(tmp_path, _gemma3(rope_parameters=LINEAR_ON_GLOBAL))
    c = loaded.config
    assert c.rope_scaling is not None and c.rope_scaling.factor == 4.0
    assert c.layer_rope_scaled == (False,) * 5 + (True,)
    assert diff <= 1e-4, diff


@pytest.mark.parametrize("rope_parameters", [None, LINEAR_ON_GLOBAL])
def test_gemma3_from_a_llama_cpp_style_gguf(tmp_path, rope_parameters):
    """The GGUF path: llama.cpp's names (post_attention_norm, ffn_norm = pre-feedforward,
    post_ffw_norm, attn_q_norm / attn_k_norm), norm weights stored as w + 1 (convert_hf_to_gguf's
    Gemma3Model), no window pattern or local RoPE base in the file, RoPE scaling (when given)
    for the global layers only: the loaded model matches transformers."""
    from tiny_gguf import write_gguf

    from trtpipe.pipeline.model.gguf import load_gguf

    hf = _gemma3(rope_parameters=rope_parameters)
    path = write_gguf(tmp_path / "tiny-gemma3.gguf", hf, "gemma3")
    loaded = load_gguf(path, with_tokenizer=False)
    c = loaded.config
    assert c.layer_sliding_window == (8, 8, 8, 8, 8, 0) and c.layer_rope_theta[::5] == (1e4, 1e6)
    assert c.layer_rope_scaled == (False,) * 5 + (True,)
    assert (c.rope_scaling is not None) == (rope_parameters is not None)
    assert c.norm_weight_offset == 0.0 and c.qk_norm and c.norm_layout == "sandwich"
    # llama.cpp's scale for a non-27B Gemma 3 is head_dim ** -0.5 (query_pre_attn_scalar is not in
    # the file): give transformers the same
    hf.config.query_pre_attn_scalar = 16
    for layer in hf.model.layers:
        layer.self_attn.scaling = 16**-0.5
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits.float().numpy()
    got = build_reference_model(loaded).forward_dense(ids).numpy()
    assert float(np.abs(got - want).max()) <= 1e-4


def test_gemma2_matches_transformers(tmp_path):
    m = _make(
        "Gemma2ForCausalLM",
        "Gemma2Config",
        0.0,
        sliding_window=8,
        num_hidden_layers=4,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        query_pre_attn_scalar=24,
    )
    diff, loaded, want = _compare(tmp_path, m)
    c = loaded.config
    assert c.layer_sliding_window == (8, 0, 8, 0)
    assert (c.attn_logit_softcap, c.final_logit_softcap, c.qk_norm) == (2.0, 3.0, False)
    assert diff <= 1e-4, diff
    assert float(np.abs(want).max()) < 3.0  # the final soft-cap bounds the logits


@pytest.mark.parametrize("arch", ["gemma2", "qwen3"])
def test_gemma2_and_qwen3_from_llama_cpp_style_ggufs(tmp_path, arch):
    """Gemma 2 (window every other layer, soft-caps from the file's keys, w + 1 norms) and Qwen 3
    (QK-norm, Llama layout: ffn_norm is the pre-MLP norm) GGUFs match transformers."""
    from tiny_gguf import write_gguf

    from trtpipe.pipeline.model.gguf import load_gguf

    if arch == "gemma2":
        hf = _make(
            "Gemma2ForCausalLM",
            "Gemma2Config",
            0.0,
            sliding_window=8,
            num_hidden_layers=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=16,  # llama.cpp: head_dim below 27B
        )
    else:
        hf = _make("Qwen3ForCausalLM", "Qwen3Config", 1.0, num_hidden_layers=4)
    loaded = load_gguf(write_gguf(tmp_path / f"tiny-{arch}.gguf", hf, arch), with_tokenizer=False)
    c = loaded.config
    if arch == "gemma2":
        assert c.layer_sliding_window == (8, 0, 8, 0) and (c.attn_logit_softcap, c.final_logit_softcap) == (2.0, 3.0)
    else:
        assert c.qk_norm and c.norm_layout == "pre" and not c.tie_word_embeddings
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits.float().numpy()
    got = build_reference_model(loaded).forward_dense(ids).numpy()
    assert float(np.abs(got - want).max()) <= 1e-4


def test_gemma2_paged_path_refuses_the_attention_softcap(tmp_path):
    m = _make("Gemma2ForCausalLM", "Gemma2Config", 0.0, sliding_window=8, num_hidden_layers=2)
    m.save_pretrained(tmp_path, safe_serialization=True)
    ref = build_reference_model(load_hf_folder(tmp_path))
    kv = [torch.zeros(2, 4, 16, 16) for _ in range(4)]
    with pytest.raises(OpError, match=r"attn_logit_softcap = 50.0 \(gemma2\).*paged_attention has no"):
        ref.run_paged([1, 2], [0, 1], [16, 17], [[1, 0]], [2], [0, 2], [1], kv)
    from trtpipe.pipeline.stages.export import export_phase

    with pytest.raises(OpError, match=r"attn_logit_softcap = 50.0 \(gemma2\).*Fix: build another family"):
        export_phase(ref, "prefill", tmp_path / "prefill.onnx", 16)
    assert not (tmp_path / "prefill.onnx").exists()


@pytest.mark.parametrize("window", [False, True])
def test_qwen3_matches_transformers(tmp_path, window):
    extra = dict(use_sliding_window=True, sliding_window=8, max_window_layers=3) if window else {}
    m = _make("Qwen3ForCausalLM", "Qwen3Config", 1.0, num_hidden_layers=4, **extra)
    diff, loaded, _ = _compare(tmp_path, m)
    c = loaded.config
    assert c.qk_norm and not c.attention_bias and c.norm_layout == "pre" and c.activation == "silu"
    assert c.layer_sliding_window == ((0, 0, 0, 8) if window else (0, 0, 0, 0))
    assert diff <= 1e-4, diff


def test_gemma3_paged_path_matches_dense(tmp_path):
    """forward_paged carries the per-layer windows, both RoPE bases, QK-norm, the embedding scale
    and the final soft-cap: greedy decoding through the paged KV pool (prompt 20, 12 steps, past
    the window of 8) gives the dense forward's logits at every generated position."""
    from trtpipe.pipeline.stages.golden.record import reference_greedy

    m = _gemma3(final_logit_softcapping=3.0)
    m.save_pretrained(tmp_path, safe_serialization=True)
    ref = build_reference_model(load_hf_folder(tmp_path))
    prompt = _ids(3, 20)[0].tolist()
    ids, logits = reference_greedy(ref, prompt, 12, block_size=4)
    dense = ref.forward_dense(torch.tensor([prompt + ids]))[0].numpy()
    want = dense[len(prompt) - 1 : len(prompt) - 1 + len(ids)]
    assert float(np.abs(np.stack(logits) - want).max()) <= 1e-4


def test_unsupported_architecture_lists_the_families_and_how_to_ask(tmp_path):
    m = _make("Qwen3ForCausalLM", "Qwen3Config", 1.0, num_hidden_layers=1)
    m.save_pretrained(tmp_path, safe_serialization=True)
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["PhiForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as e:
        load_hf_folder(tmp_path)
    msg = str(e.value)
    assert "['PhiForCausalLM']" in msg and "open a trtpipe issue naming the architecture" in msg
    for cls in ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"):
        assert cls in msg
