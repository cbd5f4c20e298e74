"""Write a tiny Hugging Face Gemma 3, Gemma 2 or Qwen 3 model as a GGUF file the way llama.cpp's
``convert_hf_to_gguf.py`` (``Gemma3Model``, ``Gemma2Model``, ``Qwen3Model``) does: llama.cpp
tensor names, Gemma's every ``*norm.weight`` stored as ``w + 1`` (``norm_shift``), no Q/K
permutation, no window pattern or local RoPE base in the metadata, Gemma 2's soft-caps as keys.
F32 tensors, no tokenizer (load with ``with_tokenizer=False``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_PRE_LAYOUT = {  # Qwen 3 (Llama layout): the norm before the MLP is HF's post_attention_layernorm
    "post_attention_layernorm": "ffn_norm"
}
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


def gguf_name(hf_name: str, sandwich: bool = True) -> str:
    """llama.cpp's name of a Hugging Face weight (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``); ``sandwich``: Gemma's four norms, else Llama's two."""
    if hf_name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        return {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm"}.get(
            hf_name, "output"
        ) + ".weight"
    _, _, idx, rest = hf_name.split(".", 3)
    part = rest.removesuffix(".weight")
    names = _LAYER if sandwich else {**_LAYER, **_PRE_LAYOUT}
    return f"blk.{idx}.{names[part]}.weight"


def _byte_tokenizer(w, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (GPT-2 style) of ``vocab_size`` tokens: byte symbols (as many as
    fit beside one merge, "e" + "r"), the merged token, then unused tokens to the size."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[: vocab_size - 1]
    alphabet = [a for a in alphabet if a not in "er"][: vocab_size - 3] + ["e", "r", "er"]
    tokens = alphabet + [f"<unused{i}>" for i in range(vocab_size - len(alphabet))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(alphabet) + [5] * (vocab_size - len(alphabet)))
    w.add_token_merges(["e r"])
    w.add_add_bos_token(False)


def write_gguf(path: Path, hf_model, arch: str, qtypes: dict[str, str] | None = None, tokenizer: bool = False) -> Path:
    """``hf_model`` (Gemma3ForCausalLM, Gemma2ForCausalLM or Qwen3ForCausalLM) as ``arch``
    ("gemma3", "gemma2", "qwen3") GGUF at ``path``. ``qtypes``: llama.cpp tensor-name part
    (``ffn_down``, ``attn_q``, ``token_embd``...) -> GGUF type to quantize it to with gguf-py
    (Q4_0, Q5_0, Q8_0...); others stay F32. ``tokenizer``: add a byte-level tokenizer (a build
    needs one)."""
    import gguf

    c = hf_model.config
    gemma = arch.startswith("gemma")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    full = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":  # what convert writes for Gemma 3 4B+ (global layers)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if gemma:
        w.add_sliding_window(c.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_vocab_size(c.vocab_size)
    for name, t in hf_model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:  # tied: no output.weight
            continue
        a = t.detach().float().numpy()
        if gemma and name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        gname = gguf_name(name, gemma)
        qtype = (qtypes or {}).get(gname.split(".")[-2] if gname.startswith("blk.") else gname.split(".")[0])
        if qtype is None:
            w.add_tensor(gname, np.ascontiguousarray(a))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(a), kind), raw_dtype=kind)
    if tokenizer:
        _byte_tokenizer(w, c.vocab_size)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
