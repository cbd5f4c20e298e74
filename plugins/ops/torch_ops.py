"""torch custom ops ``trtpipe::paged_attention`` and ``trtpipe::int4_gemm`` plus their ONNX
translations (domain ``trtpipe``, version 1), for ``torch.onnx.export(dynamo=True)``.

Meaning: docs/contracts.md and :mod:`trtpipe.plugins.ops.paged_attention.reference` (the NumPy definition). The eager
bodies here are torch implementations of the same meaning (a per-sequence loop; a reference, not a
fast path). Ops that mutate inputs do not export (TOOLCHAIN.md), so PagedAttention returns the
updated caches as new tensors; backends alias them in place.

Importing this module imports torch and onnxscript: only the build side (``trtpipe.pipeline``)
does so.
"""

from __future__ import annotations

import math

import torch


@torch.library.custom_op("trtpipe::paged_attention", mutates_args=())
def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float,
    block_size: int,
    sliding_window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paged GQA attention; see docs/contracts.md. Shapes: query [T, H*D], key/value [T, KVH*D],
    caches [KVH, NB, BS, D] (head-major), slot_mapping [T], block_tables [S, MB], context_lens [S],
    query_start_loc [S+1] (int64). Returns (output [T, H*D], key_cache_out, value_cache_out)."""
    T = query.shape[0]
    D = head_size
    kc = key_cache.clone()
    vc = value_cache.clone()
    nb, bs = kc.shape[1], kc.shape[2]
    kc.view(num_kv_heads, nb * bs, D)[:, slot_mapping] = key.view(T, num_kv_heads, D).transpose(0, 1).to(kc.dtype)
    vc.view(num_kv_heads, nb * bs, D)[:, slot_mapping] = value.view(T, num_kv_heads, D).transpose(0, 1).to(vc.dtype)
    scale = scale if scale != 0.0 else 1.0 / math.sqrt(D)
    group = num_heads // num_kv_heads
    out = torch.empty(T, num_heads, D, dtype=query.dtype)
    q_all = query.view(T, num_heads, D).float()
    qsl = query_start_loc.tolist()
    for s in range(len(qsl) - 1):
        t0, t1 = qsl[s], qsl[s + 1]
        if t1 == t0:
            continue
        L = int(context_lens[s])
        j = torch.arange(L)
        slots = block_tables[s, j // block_size] * block_size + j % block_size
        k = kc.view(num_kv_heads, nb * bs, D)[:, slots].transpose(0, 1).float()  # [L, KVH, D]
        v = vc.view(num_kv_heads, nb * bs, D)[:, slots].transpose(0, 1).float()
        k = k.repeat_interleave(group, dim=1)  # [L, H, D]
        v = v.repeat_interleave(group, dim=1)
        q = q_all[t0:t1]  # [n, H, D]
        pos = L - (t1 - t0) + torch.arange(t1 - t0)
        visible = j[None, :] <= pos[:, None]
        if sliding_window > 0:
            visible &= j[None, :] > pos[:, None] - sliding_window
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[t0:t1] = torch.einsum("hnl,lhd->nhd", probs, v).to(query.dtype)
    return out.view(T, num_heads * D), kc, vc


@paged_attention.register_fake
def _paged_attention_fake(
    query,
    key,
    value,
    key_cache,
    value_cache,
    slot_mapping,
    block_tables,
    context_lens,
    query_start_loc,
    num_heads,
    num_kv_heads,
    head_size,
    scale,
    block_size,
    sliding_window,
):
    return torch.empty_like(query), torch.empty_like(key_cache), torch.empty_like(value_cache)


def _nibbles_torch(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[...]`` -> float32 ``[..., 2]`` (low nibble, high nibble): the MatMulNBits byte
    (:mod:`trtpipe.plugins.ops.int4_gemm.pack`, whose NumPy tests define the order) in torch."""
    return torch.stack([(packed & 0x0F).float(), (packed >> 4).float()], dim=-1)


def unpack_int4_torch(b_packed: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """[N, K/G, G/2] uint8 (low nibble = even code) -> codes [N, K] float32."""
    return _nibbles_torch(b_packed).reshape(N, K)


def _zero_points_full(zero_points: torch.Tensor, N: int, n_groups: int) -> torch.Tensor:
    if zero_points.dtype == torch.uint8:
        return _nibbles_torch(zero_points).reshape(N, -1)[:, :n_groups]
    return zero_points.float()


@torch.library.custom_op("trtpipe::int4_gemm", mutates_args=())
def int4_gemm(
    a: torch.Tensor,
    b_packed: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    K: int,
    N: int,
    group_size: int,
    bits: int = 4,
) -> torch.Tensor:
    """Weight-only INT4 GEMM: a [..., K] @ W^T with W[N, K] = (q - zp) * scale blockwise along K
    (docs/contracts.md; com.microsoft::MatMulNBits layout). ``bits=8``: codes [N, K/G, G] bytes,
    default zero point 128 (an 8-bit LM head). Returns [..., N] in a's dtype."""
    n_groups = K // group_size
    if bits == 8:
        q = b_packed.float().view(N, n_groups, group_size)
        zp = zero_points.float().view(N, n_groups) if zero_points is not None else torch.full((N, n_groups), 128.0)
    else:
        q = unpack_int4_torch(b_packed, K, N).view(N, n_groups, group_size)
        zp = _zero_points_full(zero_points, N, n_groups) if zero_points is not None else torch.full((N, n_groups), 8.0)
    w = ((q - zp[..., None]) * scales.float()[..., None]).view(N, K)
    return (a.float() @ w.t()).to(a.dtype)


@int4_gemm.register_fake
def _int4_gemm_fake(a, b_packed, scales, zero_points, K, N, group_size, bits=4):
    return a.new_empty((*a.shape[:-1], N))


def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export``: each op -> one ``trtpipe`` node."""
    from trtpipe.plugins.ops.paged_attention import onnx_script as f

    return {
        torch.ops.trtpipe.paged_attention.default: f.paged_attention_onnx,
        torch.ops.trtpipe.int4_gemm.default: f.int4_gemm_onnx,
    }
