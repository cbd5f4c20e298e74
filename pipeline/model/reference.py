"""Compact Llama-family decoder in torch, written for export (the reference model).

Follows Hugging Face ``modeling_llama.py`` / ``modeling_mistral.py`` / ``modeling_qwen2.py``:
RMSNorm, RoPE from a precomputed cos/sin table (rotate-half layout), grouped-query attention,
SwiGLU MLP, tied or untied embeddings, optional q/k/v bias, per-layer sliding window and per-layer
KV head counts.

Two forward paths share every weight:

* :meth:`LlamaReference.forward_dense` — ``input_ids [B, L]`` -> logits ``[B, L, V]``, plain causal
  (and windowed) attention; used to check against transformers.
* :meth:`LlamaReference.forward_paged` — the packed, paged form that is exported to ONNX
  (docs/contracts.md "Graph I/O"): attention through ``trtpipe::paged_attention`` over the KV pool,
  linears through ``trtpipe::int4_gemm`` for INT4 weights, logits only for each sequence's last
  token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import trtpipe.plugins.ops.torch_ops  # noqa: F401  (registers torch.ops.trtpipe.*)
from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.pipeline.model.quantize import (
    FloatWeights,
    LinearWeights,
    ModelWeights,
    PackedWeights,
    QuantSpec,
    quantize_model,
)
from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.rope import rope_cos_sin
from trtpipe.runtime.artifact.model_config import ModelConfig


def _param(a: np.ndarray) -> nn.Parameter:
    """A frozen float32 parameter; copies read-only arrays (GGUF tensors are memory-mapped)."""
    a = np.asarray(a, np.float32)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, np.float32, order="C")
    return nn.Parameter(torch.from_numpy(a), requires_grad=False)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight (computed in float32, as Hugging Face LlamaRMSNorm)."""

    def __init__(self, weight: np.ndarray, eps: float):
        super().__init__()
        self.weight = _param(weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


class FloatLinear(nn.Module):
    """y = x @ W^T + b with W [out, in] float32."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None):
        super().__init__()
        self.weight = _param(weight)
        self.bias = None if bias is None else _param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Int4Linear(nn.Module):
    """Weight-only INT4 (or 8-bit) linear through ``trtpipe::int4_gemm`` (packed codes, scales,
    zero points of a :class:`~trtpipe.pipeline.model.quantize.PackedWeights`)."""

    def __init__(self, w: PackedWeights):
        super().__init__()
        self.register_buffer("b_packed", torch.from_numpy(np.ascontiguousarray(w.packed)))
        self.register_buffer("scales", torch.from_numpy(np.ascontiguousarray(w.scales, np.float32)))
        self.register_buffer("zero_points", torch.from_numpy(np.ascontiguousarray(w.zero_points, np.float32)))
        self.bias = None if w.bias is None else _param(w.bias)
        self.K, self.N, self.group_size, self.bits = w.K, w.N, w.group_size, w.bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.trtpipe.int4_gemm(
            x, self.b_packed, self.scales, self.zero_points, self.K, self.N, self.group_size, self.bits
        )
        return y if self.bias is None else y + self.bias


def make_linear(w: LinearWeights) -> nn.Module:
    """The torch linear of prepared weights: float (``F.linear``) or packed (``trtpipe::int4_gemm``)."""
    return FloatLinear(w.weight, w.bias) if isinstance(w, FloatWeights) else Int4Linear(w)


class Attention(nn.Module):
    """GQA self-attention of one layer (Hugging Face LlamaAttention semantics)."""

    def __init__(self, c: ModelConfig, i: int, weights: ModelWeights):
        super().__init__()
        p = f"model.layers.{i}.self_attn."
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.num_kv_heads = c.layer_num_kv_heads[i]
        self.sliding_window = c.layer_sliding_window[i]
        w = weights.linears
        self.q_proj = make_linear(w[p + "q_proj.weight"])
        self.k_proj = make_linear(w[p + "k_proj.weight"])
        self.v_proj = make_linear(w[p + "v_proj.weight"])
        self.o_proj = make_linear(w[p + "o_proj.weight"])
        self.scale = 1.0 / math.sqrt(c.head_dim)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, D]; cos/sin [..., n, D] (rotate-half layout, as Hugging Face)."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, i: int, weights: ModelWeights):
        super().__init__()
        p = f"model.layers.{i}.mlp."
        self.gate_proj = make_linear(weights.linears[p + "gate_proj.weight"])
        self.up_proj = make_linear(weights.linears[p + "up_proj.weight"])
        self.down_proj = make_linear(weights.linears[p + "down_proj.weight"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, model: LoadedModel, i: int, weights: ModelWeights):
        super().__init__()
        eps = model.config.rms_norm_eps
        self.input_layernorm = RMSNorm(model.float_weight(f"model.layers.{i}.input_layernorm.weight"), eps)
        self.post_attention_layernorm = RMSNorm(
            model.float_weight(f"model.layers.{i}.post_attention_layernorm.weight"), eps
        )
        self.self_attn = Attention(model.config, i, weights)
        self.mlp = MLP(i, weights)


class LlamaReference(nn.Module):
    """The reference decoder. Build with :func:`build_reference_model`.

    ``rope_table_len`` sets the cos/sin table length (default: the model's context length);
    positions at or beyond it raise :class:`OpError` in eager mode (never a silent wrap).
    ``sliding_window``: the recipe's override of every layer's window
    (:func:`~trtpipe.pipeline.model.overrides.with_sliding_window`; None keeps the model's).
    """

    def __init__(
        self,
        model: LoadedModel,
        weights: ModelWeights,
        rope_table_len: int | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        c = with_sliding_window(model.config, sliding_window)
        if c is not model.config:
            model = replace(model, config=c)
        self.config: ModelConfig = c
        self.quant = weights.quant
        embed = model.float_weight("model.embed_tokens.weight")
        self.embed_tokens = nn.Parameter(torch.from_numpy(embed), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(model, i, weights) for i in range(c.num_layers))
        self.norm = RMSNorm(model.float_weight("model.norm.weight"), c.rms_norm_eps)
        # None: tied to embed_tokens (one initializer in the graph)
        self.lm_head = None if weights.lm_head is None else make_linear(weights.lm_head)
        n = rope_table_len or c.max_position_embeddings
        scaling = None if c.rope_scaling is None else asdict(c.rope_scaling)
        cos, sin = rope_cos_sin(n, c.head_dim, c.rope_theta, scaling)
        self.register_buffer("rope_cos", torch.from_numpy(np.ascontiguousarray(cos, np.float32)))
        self.register_buffer("rope_sin", torch.from_numpy(np.ascontiguousarray(sin, np.float32)))

    # -- helpers ---------------------------------------------------------------------------
    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        if self.lm_head is None:
            return F.linear(h, self.embed_tokens)
        return self.lm_head(h)

    def _check_positions(self, positions: torch.Tensor) -> None:
        n = self.rope_cos.shape[0]
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n):
            raise OpError(
                f"positions must be in [0, {n}) (the RoPE table length); got min {int(positions.min())}, "
                f"max {int(positions.max())}. Fix: raise max_seq_len in the recipe (up to the model's context)."
            )

    # -- dense path (parity with transformers) ------------------------------------------------
    @torch.no_grad()
    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, L] int64 -> logits [B, L, V] float32 (all positions)."""
        B, L = input_ids.shape
        pos = torch.arange(L)
        self._check_positions(pos)
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        h = F.embedding(input_ids, self.embed_tokens)
        for layer in self.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = apply_rope(a.q_proj(x).view(B, L, a.num_heads, a.head_dim), cos, sin)
            k = apply_rope(a.k_proj(x).view(B, L, a.num_kv_heads, a.head_dim), cos, sin)
            v = a.v_proj(x).view(B, L, a.num_kv_heads, a.head_dim)
            g = a.num_heads // a.num_kv_heads
            k = k.repeat_interleave(g, dim=2)
            v = v.repeat_interleave(g, dim=2)
            i = torch.arange(L)
            mask = i[None, :] <= i[:, None]
            if a.sliding_window > 0:
                mask &= i[None, :] > i[:, None] - a.sliding_window
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=a.scale
            )
            h = h + a.o_proj(o.transpose(1, 2).reshape(B, L, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(h)

    # -- paged path (exported) ---------------------------------------------------------------
    def forward_paged(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        slot_mapping: torch.Tensor,  # [T] int64
        block_tables: torch.Tensor,  # [S, MB] int64
        context_lens: torch.Tensor,  # [S] int64
        query_start_loc: torch.Tensor,  # [S+1] int64
        last_token_indices: torch.Tensor,  # [S] int64
        kv_caches: list[torch.Tensor],  # 2 per layer: K, V [KVH_i, NB, BS, D] (head-major)
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Packed ragged batch over the paged KV pool -> (logits [S, V], updated caches)."""
        T = input_ids.shape[0]
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        h = F.embedding(input_ids, self.embed_tokens)
        new_caches: list[torch.Tensor] = []
        for li, layer in enumerate(self.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = apply_rope(a.q_proj(x).view(T, a.num_heads, a.head_dim), cos, sin).reshape(T, -1)
            k = apply_rope(a.k_proj(x).view(T, a.num_kv_heads, a.head_dim), cos, sin).reshape(T, -1)
            v = a.v_proj(x)
            kc, vc = kv_caches[2 * li], kv_caches[2 * li + 1]
            o, kc, vc = torch.ops.trtpipe.paged_attention(
                q,
                k,
                v,
                kc,
                vc,
                slot_mapping,
                block_tables,
                context_lens,
                query_start_loc,
                None,  # key_scale, value_scale: the exported pool is float (lowerings may retype it)
                None,
                a.num_heads,
                a.num_kv_heads,
                a.head_dim,
                a.scale,
                kc.shape[2],  # block_size: the pool is [KVH, NB, BS, D]
                a.sliding_window,
            )
            new_caches += [kc, vc]
            h = h + a.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h_last = h[last_token_indices]
        return self._logits(h_last), new_caches

    @torch.no_grad()
    def run_paged(
        self,
        input_ids,
        positions,
        slot_mapping,
        block_tables,
        context_lens,
        query_start_loc,
        last_token_indices,
        kv_caches,
    ):
        """Eager call of :meth:`forward_paged` with position checks (numpy or torch inputs)."""
        t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.int64)  # noqa: E731
        positions = t(positions)
        self._check_positions(positions)
        return self.forward_paged(
            t(input_ids),
            positions,
            t(slot_mapping),
            t(block_tables),
            t(context_lens),
            t(query_start_loc),
            t(last_token_indices),
            kv_caches,
        )


def build_reference_model(
    model: LoadedModel,
    precision: str = "fp32",
    group_size: int = 32,
    symmetric: bool = False,
    *,
    lm_head_quant: QuantSpec | None = None,
    weights: ModelWeights | None = None,
    **kw,
) -> LlamaReference:
    """Reference model of a loaded checkpoint at a weight precision ("fp32" or "int4"): its
    linears prepared first (:func:`~trtpipe.pipeline.model.quantize.quantize_model`, or the
    ``weights`` the load stage prepared), then the torch modules built over them."""
    if weights is None:
        weights = quantize_model(model, QuantSpec(precision, group_size, symmetric), lm_head_quant)
    return LlamaReference(model, weights, **kw).eval()
