"""Load a GGUF file: metadata -> ModelConfig, tensors -> Hugging Face-named weights.

Follows llama.cpp's GGUF key names (``{arch}.block_count``, ``{arch}.attention.head_count``...) and
reverses the Q/K row permutation that llama.cpp's ``convert_hf_to_gguf.py`` applies for
``llama`` (rotary "interleaved" order), as transformers' ``integrations/ggml.py`` does. Quantized
tensors keep their raw GGML blocks; rows are permuted as whole rows, so the reordering is exact.
What the file does not say (Gemma's window pattern and local RoPE base, soft-cap defaults) comes
from the family's description (:mod:`trtpipe.pipeline.model.families`, after llama.cpp). Gemma
norm weights are used as stored: llama.cpp's convert already added Gemma's ``+ 1``
(``norm_weight_offset`` 0; transformers' GGUF loader subtracts it again for its ``1 + w``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from trtpipe.pipeline.model.families import (
    FAMILIES,
    Family,
    gguf_query_pre_attn_scalar,
    layer_rope_fields,
    sliding_layers,
    unsupported_message,
)
from trtpipe.pipeline.model.tokenizer.fields import end_of_generation_ids, metadata_value, vocab_size
from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.model_config import ModelConfig, RopeScaling

# Quantized types are the ones plugins/core/gguf_blocks decodes bit-exactly (GGUF_BLOCK_TYPES): Q4_K_M files
# mix Q4_K, Q5_0, Q6_K and Q8_0; Q5_1 and Q5_K occur in Q5_* mixes.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED_ARCHS = tuple(FAMILIES)


class ModelLoadError(TrtpipeError):
    """The model file is missing, malformed, or uses something we do not support."""


_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",  # "pre" layout: the norm before the MLP
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# "sandwich" layout (Gemma 2/3; llama.cpp's names, gguf-py tensor_mapping.py)
_SANDWICH_MAP = {
    **_LAYER_MAP,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_to_hf_name(name: str, norm_layout: str = "pre") -> str | None:
    """Map a GGUF tensor name to its Hugging Face name (None for tensors we ignore).

    ``norm_layout`` (:class:`~trtpipe.runtime.artifact.model_config.ModelConfig`): in "pre"
    (Llama) ``ffn_norm`` is HF's ``post_attention_layernorm``; in "sandwich" (Gemma) it is
    ``pre_feedforward_layernorm``, and ``post_attention_norm`` / ``post_ffw_norm`` are
    ``post_attention_layernorm`` / ``post_feedforward_layernorm``."""
    if name in _GLOBAL_MAP:
        return _GLOBAL_MAP[name]
    layer_map = _SANDWICH_MAP if norm_layout == "sandwich" else _LAYER_MAP
    if name.startswith("blk."):
        _, idx, rest = name.split(".", 2)
        if rest in layer_map:
            return f"model.layers.{idx}.{layer_map[rest]}"
    return None


def _unpermute_rows(data: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute(w, n_head)`` on the row (output-feature) axis.

    data: [rows, ...] (float weights, or raw quantized rows). rows = n_head * head_dim.
    """
    rows = data.shape[0]
    return data.reshape(n_head, rows // n_head // 2, 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)


def _family(reader, path: Path) -> Family:
    arch = metadata_value(reader, "general.architecture")
    if arch not in FAMILIES:
        raise ModelLoadError(f"{path}: " + unsupported_message("general.architecture", arch, list(SUPPORTED_ARCHS)))
    return FAMILIES[str(arch)]


def _required(reader, path: Path, key: str):
    """Value of a required metadata key; :class:`ModelLoadError` naming the key when missing."""
    value = metadata_value(reader, key)
    if value is None:
        raise ModelLoadError(f"{path}: GGUF metadata key {key} is missing")
    return value


def _head_dim(reader, path: Path, arch: str, hidden: int, heads: int) -> int:
    """``{arch}.attention.key_length`` (default hidden / heads); rotary must cover all of it."""
    head_dim = int(metadata_value(reader, f"{arch}.attention.key_length", hidden // heads))
    rope_dim = metadata_value(reader, f"{arch}.rope.dimension_count", head_dim)
    if int(rope_dim) != head_dim:
        raise ModelLoadError(
            f"{path}: {arch}.rope.dimension_count = {rope_dim} differs from head_dim {head_dim}; "
            "partial rotary embeddings are not supported."
        )
    return head_dim


def _rope_scaling(reader, path: Path, arch: str) -> RopeScaling | None:
    """``{arch}.rope.scaling.type``: absent/"none" -> None, "linear" -> kept, anything else raises."""
    stype = metadata_value(reader, f"{arch}.rope.scaling.type")
    if stype in (None, "none"):
        return None
    if stype == "linear":
        return RopeScaling("linear", float(metadata_value(reader, f"{arch}.rope.scaling.factor", 1.0)))
    raise ModelLoadError(
        f"{path}: {arch}.rope.scaling.type = {stype!r} is not supported; expected "
        "'linear' (llama3 scaling is read from Hugging Face configs). Fix: convert the "
        "model from its Hugging Face folder."
    )


def _family_facts(reader, fam: Family, num_layers: int, hidden: int, heads: int, head_dim: int) -> dict:
    """The per-layer and family fields of :class:`ModelConfig` from GGUF keys and ``fam``'s
    defaults (llama.cpp ``llama-model.cpp``): windows on the family's pattern (every layer for
    families without one, as before), the local RoPE base and RoPE scaling on global layers only
    where the family has a local base, soft-caps from ``{arch}.*_logit_softcapping`` (the
    family's default when absent)."""
    arch = fam.architecture
    window = int(metadata_value(reader, f"{arch}.attention.sliding_window", 0) or 0) or fam.default_window
    sliding = sliding_layers(fam, num_layers) if fam.window_pattern else (True,) * num_layers
    sliding = tuple(s and window > 0 for s in sliding)
    theta = float(metadata_value(reader, f"{arch}.rope.freq_base", 10000.0))
    qpas = gguf_query_pre_attn_scalar(fam, num_layers, hidden, heads, head_dim)

    def cap(key: str, default: float) -> float:
        return float(metadata_value(reader, f"{arch}.{key}", default) or 0.0) if fam.gguf_softcap_keys else 0.0

    return dict(
        rope_theta=theta,
        layer_sliding_window=tuple(window if s else 0 for s in sliding),
        **layer_rope_fields(sliding, theta, fam.local_rope_theta),
        norm_layout=fam.norm_layout,
        norm_weight_offset=0.0,  # llama.cpp's convert stored Gemma's 1 + w
        qk_norm=fam.qk_norm,
        activation=fam.activation,
        embedding_scale=hidden**0.5 if fam.scale_embedding else 1.0,
        attention_scale=qpas**-0.5 if qpas else 0.0,
        # only families whose attention has a soft-cap read it (llama.cpp: Gemma 2, not Gemma 3)
        attn_logit_softcap=cap("attn_logit_softcapping", fam.attn_logit_softcap) if fam.attn_logit_softcap else 0.0,
        final_logit_softcap=cap("final_logit_softcapping", fam.final_logit_softcap),
    )


def config_from_gguf(reader, path: Path) -> ModelConfig:
    """Model facts from GGUF metadata (a ``gguf.GGUFReader``; ``path`` names the file in errors).

    Key names follow llama.cpp (``{arch}.block_count``, ``{arch}.attention.head_count``, ...);
    family defaults the file lacks: :func:`_family_facts`.
    End-of-generation ids: :func:`~trtpipe.pipeline.model.tokenizer.end_of_generation_ids`.
    Raises :class:`ModelLoadError` for an unsupported architecture, partial rotary, an unsupported
    RoPE scaling type, or a missing required key (each named).
    """
    fam = _family(reader, path)
    arch = fam.architecture
    num_layers = int(_required(reader, path, f"{arch}.block_count"))
    hidden = int(_required(reader, path, f"{arch}.embedding_length"))
    heads = int(_required(reader, path, f"{arch}.attention.head_count"))
    head_dim = _head_dim(reader, path, arch, hidden, heads)
    vocab = int(metadata_value(reader, f"{arch}.vocab_size", 0) or vocab_size(reader.fields))
    names = {t.name for t in reader.tensors}
    bos = metadata_value(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        architecture=arch,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(metadata_value(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(_required(reader, path, f"{arch}.feed_forward_length")),
        vocab_size=vocab,
        max_position_embeddings=int(_required(reader, path, f"{arch}.context_length")),
        rms_norm_eps=float(_required(reader, path, f"{arch}.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        rope_scaling=_rope_scaling(reader, path, arch),
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=end_of_generation_ids(reader),
        chat_template=metadata_value(reader, "tokenizer.chat_template"),
        name=str(metadata_value(reader, "general.name", path.stem)),
        **_family_facts(reader, fam, num_layers, hidden, heads, head_dim),
    )


def load_gguf(path: str | Path, *, with_tokenizer: bool = True) -> LoadedModel:
    """Read a GGUF file.

    Returns a :class:`LoadedModel` whose weights are Hugging Face-named :class:`WeightTensor` s;
    quantized tensors (any of :data:`SUPPORTED_TYPES`) stay as raw blocks ``uint8 [rows,
    row_bytes]`` (memory-mapped by ``gguf.GGUFReader``): the build repacks Q4_0 / Q4_1 / Q8_0
    exactly and dequantizes the others exactly (``gguf.quants.dequantize``, bit for bit
    :func:`trtpipe.plugins.core.gguf_blocks.dequantize_blocks`) where it needs floats.

    Raises :class:`ModelLoadError` for a missing file, an unsupported architecture, or a tensor
    of an unsupported GGML type (naming the tensor and the type).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist. Fix: check model.source in the recipe.")
    t0 = time.perf_counter()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e
    config = config_from_gguf(reader, path)
    weights: dict[str, WeightTensor] = {}
    for t in reader.tensors:
        hf = gguf_to_hf_name(t.name, config.norm_layout)
        if hf is None:
            continue
        qtype = t.tensor_type.name
        if qtype not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{path}: tensor {t.name!r} has GGML type {qtype}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_TYPES)}. Fix: re-quantize the file with one of them."
            )
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # GGUF lists ne0 (fastest) first
        data = t.data
        if qtype in ("F16", "BF16"):
            if qtype == "F16":
                data = np.asarray(data, dtype=np.float16).astype(np.float32)
            else:
                data = (np.asarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            qtype = "F32"
        data = data.reshape(shape) if qtype == "F32" else data.reshape(shape[0], -1)
        permuted = FAMILIES[config.architecture].gguf_permuted_qk
        if permuted and (hf.endswith("q_proj.weight") or hf.endswith("q_proj.bias")):
            data = _unpermute_rows(data, config.num_heads)
        elif permuted and (hf.endswith("k_proj.weight") or hf.endswith("k_proj.bias")):
            data = _unpermute_rows(data, config.num_kv_heads)
        weights[hf] = WeightTensor(hf, shape, qtype, data)
    tok_json = None
    if with_tokenizer:
        from trtpipe.pipeline.model.tokenizer import tokenizer_from_gguf_fields

        tok_json = tokenizer_from_gguf_fields(reader).to_str()
    return LoadedModel(
        config=config,
        weights=weights,
        source_path=path,
        source_kind="gguf",
        tokenizer_json=tok_json,
        load_time_s=time.perf_counter() - t0,
    )
