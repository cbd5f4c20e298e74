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
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import trtpipe.plugins.ops.torch_ops  # noqa: F401  (registers torch.ops.trtpipe.*)
from trtpipe.pipeline.model_config_override import with_sliding_window
from trtpipe.pipeline.weights import LoadedModel
from trtpipe.plugins.core.dtypes import FLOAT_NAMES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.rope import rope_cos_sin
from trtpipe.plugins.ops.int4_gemm import pack as int4_pack
from trtpipe.plugins.ops.int4_gemm.layout import unpack_zero_points_uint8
from trtpipe.runtime.artifact.model_config import ModelConfig


@dataclass(frozen=True)
class QuantSpec:
    """How linear weights are stored: ``precision`` "fp32" or "int4" (group size, symmetric)."""

    precision: str = "fp32"
    group_size: int = 32
    symmetric: bool = False


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
    """Weight-only INT4 linear through ``trtpipe::int4_gemm`` (packed codes, scales, zero points)."""

    def __init__(
        self,
        packed: np.ndarray,
        scales: np.ndarray,
        zero_points: np.ndarray,
        K: int,
        N: int,
        group_size: int,
        bias: np.ndarray | None = None,
        bits: int = 4,
    ):
        super().__init__()
        self.register_buffer("b_packed", torch.from_numpy(np.ascontiguousarray(packed)))
        self.register_buffer("scales", torch.from_numpy(np.ascontiguousarray(scales, np.float32)))
        zp = np.ascontiguousarray(zero_points)
        if zp.dtype == np.uint8 and bits == 4:  # packed 4-bit -> float (one export signature; exact for integers)
            zp = unpack_zero_points_uint8(zp, N, K // group_size)
        self.register_buffer("zero_points", torch.from_numpy(zp.astype(np.float32)))
        self.bias = None if bias is None else _param(bias)
        self.K, self.N, self.group_size, self.bits = K, N, group_size, bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.trtpipe.int4_gemm(
            x, self.b_packed, self.scales, self.zero_points, self.K, self.N, self.group_size, self.bits
        )
        return y if self.bias is None else y + self.bias


def make_linear(model: LoadedModel, name: str, quant: QuantSpec, bias_name: str | None = None) -> nn.Module:
    """Build the linear for weight ``name``: float, or INT4 (exact repack of GGUF Q4_0/Q4_1,
    round-to-nearest otherwise)."""
    w = model.weights[name]
    bias = model.float_weight(bias_name) if bias_name and bias_name in model.weights else None
    if quant.precision in FLOAT_NAMES:
        return FloatLinear(w.to_float(), bias)
    N, K = w.shape
    if quant.precision == "int8":  # 8-bit weights: GGUF Q8_0 repacked exactly (the LM head)
        if w.qtype != "Q8_0":
            raise OpError(f"int8 weights are only built from GGUF Q8_0 tensors; {name} is {w.qtype}")
        codes, scales = int4_pack.repack_gguf_q8_0_as_uint8(w.data, N, K)
        return Int4Linear(codes, scales, np.full(scales.shape, 128.0, np.float32), K, N, 32, bias, bits=8)
    if quant.precision != "int4":
        raise OpError(f"precision {quant.precision!r} is not supported for linear {name}")
    if w.qtype == "Q4_0" and quant.group_size == 32:
        packed, scales, zp = int4_pack.repack_gguf_q4_0(w.data, N, K)
    elif w.qtype == "Q4_1" and quant.group_size == 32:
        packed, scales, zp = int4_pack.repack_gguf_q4_1(w.data, N, K)
    else:
        packed, scales, zp = int4_pack.quantize_rtn(w.to_float(), quant.group_size, quant.symmetric)
        if zp is None:
            zp = int4_pack.pack_zero_points_uint8(np.full((N, K // quant.group_size), 8, np.uint8))
    return Int4Linear(packed, scales, zp, K, N, quant.group_size, bias)


class Attention(nn.Module):
    """GQA self-attention of one layer (Hugging Face LlamaAttention semantics)."""

    def __init__(self, model: LoadedModel, i: int, quant: QuantSpec):
        super().__init__()
        c = model.config
        p = f"model.layers.{i}.self_attn."
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.num_kv_heads = c.layer_num_kv_heads[i]
        self.sliding_window = c.layer_sliding_window[i]
        bias = c.attention_bias
        self.q_proj = make_linear(model, p + "q_proj.weight", quant, p + "q_proj.bias" if bias else None)
        self.k_proj = make_linear(model, p + "k_proj.weight", quant, p + "k_proj.bias" if bias else None)
        self.v_proj = make_linear(model, p + "v_proj.weight", quant, p + "v_proj.bias" if bias else None)
        self.o_proj = make_linear(model, p + "o_proj.weight", quant)
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

    def __init__(self, model: LoadedModel, i: int, quant: QuantSpec):
        super().__init__()
        p = f"model.layers.{i}.mlp."
        self.gate_proj = make_linear(model, p + "gate_proj.weight", quant)
        self.up_proj = make_linear(model, p + "up_proj.weight", quant)
        self.down_proj = make_linear(model, p + "down_proj.weight", quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, model: LoadedModel, i: int, quant: QuantSpec):
        super().__init__()
        eps = model.config.rms_norm_eps
        self.input_layernorm = RMSNorm(model.float_weight(f"model.layers.{i}.input_layernorm.weight"), eps)
        self.post_attention_layernorm = RMSNorm(
            model.float_weight(f"model.layers.{i}.post_attention_layernorm.weight"), eps
        )
        self.self_attn = Attention(model, i, quant)
        self.mlp = MLP(model, i, quant)


class LlamaReference(nn.Module):
    """The reference decoder. Build with :func:`build_reference_model`.

    ``rope_table_len`` sets the cos/sin table length (default: the model's context length);
    positions at or beyond it raise :class:`OpError` in eager mode (never a silent wrap).
    ``sliding_window``: the recipe's override of every layer's window
    (:func:`~trtpipe.pipeline.model_config_override.with_sliding_window`; None keeps the model's).
    """

    def __init__(
        self,
        model: LoadedModel,
        quant: QuantSpec = QuantSpec(),
        rope_table_len: int | None = None,
        sliding_window: int | None = None,
        lm_head_quant: QuantSpec | None = None,
    ):
        super().__init__()
        c = with_sliding_window(model.config, sliding_window)
        if c is not model.config:
            model = replace(model, config=c)
        self.config: ModelConfig = c
        self.quant = quant
        embed = model.float_weight("model.embed_tokens.weight")
        self.embed_tokens = nn.Parameter(torch.from_numpy(embed), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(model, i, quant) for i in range(c.num_layers))
        self.norm = RMSNorm(model.float_weight("model.norm.weight"), c.rms_norm_eps)
        head = model.weights[model.lm_head_name()]
        if lm_head_quant is None and quant.precision == "int4" and head.qtype == "Q8_0":
            # Decode reads the LM head every token: keep GGUF's Q8_0 bytes (exact, 4x smaller
            # than fp32) instead of dequantizing to fp32 (113 MB/token for SmolLM2).
            lm_head_quant = QuantSpec("int8", 32)
        lm_q = lm_head_quant or QuantSpec("fp32")
        if lm_q.precision == "fp32" and model.lm_head_name() == "model.embed_tokens.weight":
            self.lm_head = None  # tied: reuse embed_tokens (one initializer in the graph)
        else:
            self.lm_head = make_linear(model, model.lm_head_name(), lm_q)
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
    model: LoadedModel, precision: str = "fp32", group_size: int = 32, symmetric: bool = False, **kw
) -> LlamaReference:
    """Reference model for a loaded checkpoint at a weight precision ("fp32" or "int4")."""
    return LlamaReference(model, QuantSpec(precision, group_size, symmetric), **kw).eval()
