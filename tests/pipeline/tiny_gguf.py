"""Write a tiny Hugging Face Gemma 3 model as a GGUF file the way llama.cpp's
``convert_hf_to_gguf.py`` (``Gemma3Model``) does: llama.cpp tensor names, every ``*norm.weight``
stored as ``w + 1`` (``norm_shift``), no Q/K permutation, no window pattern or local RoPE base in
the metadata. F32 tensors, no tokenizer (load with ``with_tokenizer=False``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name of a Gemma 3 Hugging Face weight (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``)."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    _, _, idx, rest = hf_name.split(".", 3)
    return f"blk.{idx}.{_LAYER[rest.removesuffix('.weight')]}.weight"


def write_gemma3_gguf(path: Path, hf_model) -> Path:
    import gguf

    c = hf_model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    full = c.rope_parameters["full_attention"]
    w.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":  # what convert writes for Gemma 3 4B+ (global layers)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_vocab_size(c.vocab_size)
    for name, t in hf_model.state_dict().items():
        if name == "lm_head.weight":  # tied: llama.cpp writes no output.weight
            continue
        a = t.detach().float().numpy()
        if name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
