"""A NumPy reference that runs a Llama-family model layer by layer from its loaded weights, holding
one layer's fp32 weights at a time: logits of a 7B model without its 27 GB fp32 copy (issue 44).

    token ids ──embedding rows (only those dequantized)──► h [T, hidden]
    for each layer: dequantize its 7 linears + 2 norms ─► h += attn(norm(h)); h += mlp(norm(h)) ─► drop them
    h[positions] ──final norm──► LM head, dequantized ``head_rows_per_chunk`` vocabulary rows at a time

Follows HF ``modeling_llama.py`` (RMSNorm, rotate-half RoPE over the loader's un-permuted q/k
rows, grouped-query attention with a causal mask, SwiGLU MLP) in float32; weights are gguf-py's
dequantization (``WeightTensor.to_float``), the torch reference's fp32 weights. Runs the Llama
description only: :class:`LayerwiseError` names any other family field it would need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.plugins.core.errors import TrtpipeError

_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


class LayerwiseError(TrtpipeError, ValueError):
    """The layer-by-layer reference cannot run this model or these inputs."""


@dataclass(frozen=True)
class LayerwiseLogits:
    """Logits at ``positions`` of one token sequence and what computing them held."""

    positions: tuple[int, ...]
    logits: np.ndarray  # float32 [len(positions), vocab]
    max_layer_weight_bytes: int  # the largest one layer's fp32 weights (linears + norms), bytes


def _check(model: LoadedModel, token_ids: Sequence[int], positions: Sequence[int]) -> None:
    c = model.config
    odd = list(c.non_llama_features())
    if c.attention_bias or c.rope_scaling or any(c.layer_sliding_window):
        odd.append("attention bias / rope_scaling / sliding window")
    if odd:
        raise LayerwiseError(
            f"model {c.name!r} has {', '.join(odd)}; the layer-by-layer reference runs the Llama description "
            "only. Fix: use the torch reference (pipeline/model/reference) for this model."
        )
    bad = [p for p in positions if not 0 <= p < len(token_ids)]
    if not token_ids or bad or any(not 0 <= t < c.vocab_size for t in token_ids):
        raise LayerwiseError(
            f"positions {bad or list(positions)} / {len(token_ids)} token ids; expected ids in [0, {c.vocab_size}) "
            f"and positions in [0, {len(token_ids)}). Fix: pass positions inside the sequence."
        )


def _rows(w: WeightTensor, rows: np.ndarray | slice) -> np.ndarray:
    """float32 rows of a [rows, cols] weight, only those dequantized (gguf-py, row blocks whole)."""
    if not w.is_quantized:
        return np.asarray(w.data, dtype=np.float32).reshape(w.shape)[rows]
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.asarray(dequantize(np.asarray(w.data[rows]), GGMLQuantizationType[w.qtype]), dtype=np.float32)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * weight


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, D]; cos/sin [T, D] (rotate-half: HF ``apply_rotary_pos_emb``)."""
    half = x.shape[-1] // 2
    rot = np.concatenate((-x[..., half:], x[..., :half]), axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def _attention(model: LoadedModel, w: dict[str, np.ndarray], x: np.ndarray, cos, sin) -> np.ndarray:
    """Causal grouped-query attention of x [T, hidden] -> [T, hidden]."""
    c, T = model.config, x.shape[0]
    q = (x @ w["self_attn.q_proj"].T).reshape(T, c.num_heads, c.head_dim)
    k = (x @ w["self_attn.k_proj"].T).reshape(T, c.num_kv_heads, c.head_dim)
    v = (x @ w["self_attn.v_proj"].T).reshape(T, c.num_kv_heads, c.head_dim)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    g = c.num_heads // c.num_kv_heads
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # [T, heads, D]
    scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(c.softmax_scale)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, np.float32(-np.inf))
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", probs, v).reshape(T, -1)
    return o @ w["self_attn.o_proj"].T


def _layer(model: LoadedModel, i: int, h: np.ndarray, cos, sin) -> tuple[np.ndarray, int]:
    """Decoder layer ``i`` over h [T, hidden]; its fp32 weights made here and dropped on return."""
    c, p = model.config, f"model.layers.{i}"
    w = {n: model.float_weight(f"{p}.{n}.weight") for n in _LINEARS}
    w["in_norm"] = model.float_weight(f"{p}.input_layernorm.weight")
    w["mlp_norm"] = model.float_weight(f"{p}.post_attention_layernorm.weight")
    h = h + _attention(model, w, _rms_norm(h, w["in_norm"], c.rms_norm_eps), cos, sin)
    x = _rms_norm(h, w["mlp_norm"], c.rms_norm_eps)
    gate = x @ w["mlp.gate_proj"].T
    h = h + (gate / (1 + np.exp(-gate)) * (x @ w["mlp.up_proj"].T)) @ w["mlp.down_proj"].T
    return h.astype(np.float32), sum(a.nbytes for a in w.values())


def layerwise_logits(
    model: LoadedModel, token_ids: Sequence[int], positions: Sequence[int], *, head_rows_per_chunk: int = 8192
) -> LayerwiseLogits:
    """Logits float32 [len(positions), vocab] of the causal sequence ``token_ids`` at ``positions``
    (0-based), layer by layer (module docstring). Raises :class:`LayerwiseError` for a model
    outside the Llama description or positions / ids out of range."""
    _check(model, token_ids, positions)
    c, T = model.config, len(token_ids)
    h = _rows(model.weights["model.embed_tokens.weight"], np.asarray(token_ids))
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
    angles = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1)).astype(np.float32)
    sin = np.sin(np.concatenate([angles, angles], -1)).astype(np.float32)
    biggest = 0
    for i in range(c.num_layers):
        h, held = _layer(model, i, h, cos, sin)
        biggest = max(biggest, held)
    x = _rms_norm(h[list(positions)], model.float_weight("model.norm.weight"), c.rms_norm_eps)
    head = model.weights[model.lm_head_name()]
    logits = np.empty((len(positions), c.vocab_size), dtype=np.float32)
    for r in range(0, c.vocab_size, head_rows_per_chunk):
        rows = slice(r, min(r + head_rows_per_chunk, c.vocab_size))
        logits[:, rows] = x @ _rows(head, rows).T
    return LayerwiseLogits(tuple(positions), logits, biggest)
