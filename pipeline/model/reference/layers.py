"""One decoder layer of the reference model, driven by the :class:`ModelConfig` description.

Follows Hugging Face ``modeling_llama.py`` (RMSNorm, rotate-half RoPE, GQA, SwiGLU),
``modeling_qwen3.py`` (QK-norm over ``head_dim`` before RoPE), ``modeling_gemma2.py`` /
``modeling_gemma3.py`` (sandwich norms, GELU-tanh MLP, ``query_pre_attn_scalar``, attention-logit
soft-cap, QK-norm). Norm weights are held as the multiplier the forward uses
(``norm_weight_offset + w``, added once in float32: the same number as HF's ``1.0 + w``).
The layer body (:meth:`DecoderLayer.run`) is written once; the dense and paged paths differ only
in the attention callable they pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtpipe.pipeline.model.quantize import ModelWeights
from trtpipe.pipeline.model.reference.linears import frozen_param, make_linear
from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.runtime.artifact.model_config import ModelConfig


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis, float32 (HF LlamaRMSNorm;
    ``offset`` 1.0 gives HF Gemma3RMSNorm's ``1 + w``)."""

    def __init__(self, weight: np.ndarray, eps: float, offset: float = 0.0):
        super().__init__()
        w = np.asarray(weight, np.float32)
        self.weight = frozen_param(w + np.float32(offset) if offset else w)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, D]; cos/sin [..., n, D] (rotate-half layout, as Hugging Face)."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def _norm(model: LoadedModel, name: str) -> RMSNorm:
    c = model.config
    return RMSNorm(model.float_weight(name), c.rms_norm_eps, c.norm_weight_offset)


class Attention(nn.Module):
    """GQA self-attention of one layer: projections, optional QK-norm, RoPE (HF LlamaAttention,
    Qwen3Attention, Gemma3Attention semantics)."""

    def __init__(self, model: LoadedModel, i: int, weights: ModelWeights):
        super().__init__()
        c = model.config
        p = f"model.layers.{i}.self_attn."
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.num_kv_heads = c.layer_num_kv_heads[i]
        self.sliding_window = c.layer_sliding_window[i]
        w = weights.linears
        self.q_proj = make_linear(w[p + "q_proj.weight"])
        self.k_proj = make_linear(w[p + "k_proj.weight"])
        self.v_proj = make_linear(w[p + "v_proj.weight"])
        self.o_proj = make_linear(w[p + "o_proj.weight"])
        self.q_norm = _norm(model, p + "q_norm.weight") if c.qk_norm else None
        self.k_norm = _norm(model, p + "k_norm.weight") if c.qk_norm else None
        self.scale = c.softmax_scale
        self.softcap = c.attn_logit_softcap

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [..., n, hidden] -> q [..., n, H, D], k [..., n, KVH, D] (normed, rotated), v [..., n, KVH*D]."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        q = apply_rope(q if self.q_norm is None else self.q_norm(q), cos, sin)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        k = apply_rope(k if self.k_norm is None else self.k_norm(k), cos, sin)
        return q, k, self.v_proj(x)

    def dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal (windowed) attention over a whole prompt: q [B, L, H, D], k [B, L, KVH, D],
        v [B, L, KVH*D] -> [B, L, H*D]. A query at p sees keys j with p - W < j <= p (W = 0: all);
        with a soft-cap, scores become ``c * tanh(scores / c)`` before the mask (HF
        ``eager_attention_forward``)."""
        B, L = q.shape[:2]
        g = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(g, dim=2).transpose(1, 2)
        v = v.view(B, L, self.num_kv_heads, self.head_dim).repeat_interleave(g, dim=2).transpose(1, 2)
        q = q.transpose(1, 2)
        i = torch.arange(L)
        mask = i[None, :] <= i[:, None]
        if self.sliding_window > 0:
            mask &= i[None, :] > i[:, None] - self.sliding_window
        if self.softcap:
            scores = q @ k.transpose(-1, -2) * self.scale
            scores = torch.tanh(scores / self.softcap) * self.softcap
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            o = probs @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2).reshape(B, L, -1)


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or GELU-tanh (Gemma's GeGLU)."""

    def __init__(self, i: int, weights: ModelWeights, activation: str):
        super().__init__()
        p = f"model.layers.{i}.mlp."
        self.gate_proj = make_linear(weights.linears[p + "gate_proj.weight"])
        self.up_proj = make_linear(weights.linears[p + "up_proj.weight"])
        self.down_proj = make_linear(weights.linears[p + "down_proj.weight"])
        self.gelu = activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate_proj(x)
        g = F.gelu(g, approximate="tanh") if self.gelu else F.silu(g)
        return self.down_proj(g * self.up_proj(x))


# attend(attention module, normed input [..., hidden]) -> attention output before o_proj [..., H*D]
Attend = Callable[[Attention, torch.Tensor], torch.Tensor]


class DecoderLayer(nn.Module):
    """Norms, attention and MLP of layer ``i`` in the config's ``norm_layout`` ("pre" or
    "sandwich"; modules carry the Hugging Face names, so in "pre" ``post_attention_layernorm``
    is the norm before the MLP)."""

    def __init__(self, model: LoadedModel, i: int, weights: ModelWeights):
        super().__init__()
        c: ModelConfig = model.config
        p = f"model.layers.{i}."
        self.sandwich = c.norm_layout == "sandwich"
        self.input_layernorm = _norm(model, p + "input_layernorm.weight")
        self.post_attention_layernorm = _norm(model, p + "post_attention_layernorm.weight")
        if self.sandwich:
            self.pre_feedforward_layernorm = _norm(model, p + "pre_feedforward_layernorm.weight")
            self.post_feedforward_layernorm = _norm(model, p + "post_feedforward_layernorm.weight")
        self.self_attn = Attention(model, i, weights)
        self.mlp = MLP(i, weights, c.activation)

    @staticmethod
    def final_norm(model: LoadedModel) -> RMSNorm:
        """The norm before the LM head (``model.norm.weight``)."""
        return _norm(model, "model.norm.weight")

    def run(self, h: torch.Tensor, attend: Attend) -> torch.Tensor:
        """h [..., hidden] residual stream -> the next layer's; ``attend`` computes attention."""
        a = self.self_attn.o_proj(attend(self.self_attn, self.input_layernorm(h)))
        if self.sandwich:
            h = h + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))
