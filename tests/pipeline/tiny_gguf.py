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


def write_gemma3_gguf(path: Path, hf_model, qtypes: dict[str, str] | None = None, tokenizer: bool = False) -> Path:
    """``qtypes``: llama.cpp tensor-name suffix (``ffn_down``, ``attn_q``, ``token_embd``...) ->
    GGUF type to quantize it to with gguf-py (Q4_0, Q5_0, Q8_0...); others stay F32.
    ``tokenizer``: add a byte-level tokenizer (a build needs one)."""
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
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_vocab_size(c.vocab_size)
    for name, t in hf_model.state_dict().items():
        if name == "lm_head.weight":  # tied: llama.cpp writes no output.weight
            continue
        a = t.detach().float().numpy()
        if name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        gname = gguf_name(name)
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
