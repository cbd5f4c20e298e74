"""Triton kernels of the ``trtpipe`` custom ops, for the GPU backends (TensorRT plugins, AOT).

Kernels (each with a launcher that takes torch tensors, and an AOT entry in :data:`AOT_KERNELS`):

- :func:`write_kv_cache_kernel` -- vLLM ``reshape_and_cache``: writes this step's K/V rows into
  the paged pool at ``slot_mapping`` (the "write first" half of ``trtpipe::PagedAttention``).
- :func:`paged_attention_decode_kernel` -- one query token per sequence; one program per
  (sequence, kv head) handles the whole GQA group; online softmax over the sequence's keys
  read through its block table (vLLM paged attention v1 / flash-decoding without the split).
- :func:`paged_attention_prefill_kernel` -- ragged packed query chunks (prefill, chunked
  prefill, prefix reuse); one program per (query tile, kv head); rows = BLOCK_Q tokens x
  GROUP query heads, so K/V tiles are loaded once per GQA group and multiplied with ``tl.dot``.
  Query tiles are mapped to sequences by a binary search over ``qsl[s] // BLOCK_Q + s``
  (the vLLM Triton unified-attention scheme), so the grid ``T // BLOCK_Q + S`` needs no host
  sync.
- :func:`int4_gemm_kernel` -- fused dequantization W4A16 GEMM/GEMV with the
  ``com.microsoft::MatMulNBits`` packing: ``Y = A @ ((q - zp) * scale)^T``, zero points absent
  (8), packed uint8 or float.

Semantics are defined by :mod:`trtpipe.plugins.reference` (see ``docs/contracts.md``);
tests run these kernels under ``TRITON_INTERPRET=1`` against it and compile them to
cubin/PTX for sm_80 / sm_87 / sm_90 without a GPU (:func:`aot_compile`).

Numerics: softmax, scores and accumulators are float32. ``tl.dot`` runs on the input dtype
(fp16 -> tensor cores, fp32 accumulate); float32 inputs use ``input_precision="ieee"``
by default (no TF32 truncation), overridable with ``input_precision``.

KV pool: ``[NB, BS, KVH, D]`` contiguous, so slot ``s`` starts at element ``s * KVH * D``.
Offsets are computed in int64 (block tables and slots are int64).

This module imports triton at module level (it is the Triton module; import it lazily) and
torch only inside the launchers.
"""

from __future__ import annotations

import math
from typing import Any

import triton
import triton.language as tl

from trtpipe.plugins.errors import OpError
from trtpipe.plugins.int4_pack import check_group_size

__all__ = [
    "write_kv_cache_kernel",
    "paged_attention_decode_kernel",
    "paged_attention_prefill_kernel",
    "int4_gemm_kernel",
    "write_kv_cache",
    "paged_attention_decode",
    "paged_attention_prefill",
    "paged_attention",
    "int4_gemm",
    "AOT_KERNELS",
    "aot_compile",
]


# ============================================================================================
# kernels
# ============================================================================================


@triton.jit
def write_kv_cache_kernel(
    key_ptr,  # [T, KVH*D] rows of this step's K
    value_ptr,  # [T, KVH*D]
    key_cache_ptr,  # [NB, BS, KVH, D] contiguous
    value_cache_ptr,  # [NB, BS, KVH, D] contiguous
    slot_mapping_ptr,  # [T] int64
    stride_key_t,  # elements between rows of key
    stride_value_t,
    KVH_D: tl.constexpr,  # num_kv_heads * head_size
    BLOCK: tl.constexpr,  # next power of two >= KVH_D
):
    """Grid (T,). Token t's K/V row goes to slot slot_mapping[t]; a negative slot is skipped
    (vLLM's padding convention; the reference rejects it)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t)
    offs = tl.arange(0, BLOCK)
    mask = (offs < KVH_D) & ((offs * 0 + slot) >= 0)  # explicit broadcast (interpreter)
    k = tl.load(key_ptr + t * stride_key_t + offs, mask=mask)
    v = tl.load(value_ptr + t * stride_value_t + offs, mask=mask)
    dst = slot * KVH_D + offs
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def paged_attention_decode_kernel(
    out_ptr,  # [S, H*D]
    query_ptr,  # [S, H*D], token s belongs to sequence s
    key_cache_ptr,  # [NB, BS, KVH, D]
    value_cache_ptr,
    block_tables_ptr,  # [S, MB] int64
    context_lens_ptr,  # [S] int64 (query position = context_len - 1)
    scale,  # fp32 softmax scale (already resolved: never 0)
    sliding_window,  # int32, 0 = off
    stride_q,  # elements between query rows
    stride_out,
    stride_bt,  # MB
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # KV page size (tokens per block)
    GROUP: tl.constexpr,  # num_heads // num_kv_heads
    GROUP_PAD: tl.constexpr,  # next power of two >= GROUP
    D_PAD: tl.constexpr,  # next power of two >= HEAD_SIZE
    BLOCK_N: tl.constexpr,  # keys per iteration
):
    """Grid (S, KVH). Query heads kvh*GROUP .. kvh*GROUP+GROUP-1 of sequence s against keys
    j in [max(0, p-W+1), p], p = context_lens[s] - 1; block table entries of keys outside the
    window are never read."""
    s = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    ctx = tl.load(context_lens_ptr + s)
    pos = ctx - 1
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < GROUP
    dmask = d < HEAD_SIZE
    h = kvh * GROUP + g
    q_off = s * stride_q + h[:, None] * HEAD_SIZE + d[None, :]
    q = tl.load(query_ptr + q_off, mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    q = q * scale
    lo = tl.where(sliding_window > 0, tl.maximum(pos - sliding_window + 1, 0), 0)
    start = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    for j0 in range(start, ctx, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        jvalid = (j >= lo) & (j < ctx)
        blk = tl.load(block_tables_ptr + s * stride_bt + j // BLOCK_SIZE, mask=jvalid, other=0)
        slot = blk * BLOCK_SIZE + j % BLOCK_SIZE
        kv_off = slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE) + kvh * HEAD_SIZE + d[None, :]
        kv_mask = jvalid[:, None] & dmask[None, :]
        k = tl.load(key_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, N]
        scores = tl.where(jvalid[None, :], scores, float("-inf"))
        # every tile holds at least one visible key, so m_new is finite
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(value_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # context_lens 0 (padding row) -> 0
    o_off = s * stride_out + h[:, None] * HEAD_SIZE + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])


@triton.jit
def paged_attention_prefill_kernel(
    out_ptr,  # [T, H*D]
    query_ptr,  # [T, H*D] packed ragged chunks
    key_cache_ptr,  # [NB, BS, KVH, D] (this step's K/V already written)
    value_cache_ptr,
    block_tables_ptr,  # [S, MB] int64
    context_lens_ptr,  # [S] int64, tokens in the pool after this step
    query_start_loc_ptr,  # [S+1] int64
    num_seqs,  # int32 S
    scale,  # fp32 softmax scale (never 0)
    sliding_window,  # int32, 0 = off
    stride_q,
    stride_out,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per tile; rows = BLOCK_Q * GROUP_PAD >= 16
    BLOCK_N: tl.constexpr,  # keys per iteration, >= 16
    INPUT_PRECISION: tl.constexpr,  # tl.dot input precision ("ieee" for exact fp32)
):
    """Grid (T // BLOCK_Q + S, KVH). Tile -> sequence by binary search; row r of the tile is
    token q_start + r // GROUP_PAD, query head kvh*GROUP + r % GROUP_PAD."""
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    # largest s in [0, S-1] with qsl[s] // BLOCK_Q + s <= tile (tile starts strictly increase)
    lo_s = 0
    hi_s = num_seqs - 1
    while lo_s < hi_s:
        mid = (lo_s + hi_s + 1) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        take = first_tile <= tile
        lo_s = tl.where(take, mid, lo_s)
        hi_s = tl.where(take, hi_s, mid - 1)
    s = lo_s.to(tl.int64)
    q_begin = tl.load(query_start_loc_ptr + s)
    n = tl.load(query_start_loc_ptr + s + 1) - q_begin
    ctx = tl.load(context_lens_ptr + s)
    q_start = (tile - (q_begin // BLOCK_Q + s)) * BLOCK_Q  # first chunk token of this tile
    first_pos = ctx - n  # position of the chunk's token 0

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    r = tl.arange(0, BLOCK_M)
    tok = q_start + r // GROUP_PAD  # token index within the chunk
    g = r % GROUP_PAD
    row_valid = (tok < n) & (g < GROUP)
    pos = first_pos + tok  # [M]
    h = kvh * GROUP + g
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_SIZE
    t = q_begin + tok
    q_off = t[:, None] * stride_q + h[:, None] * HEAD_SIZE + d[None, :]
    q = tl.load(query_ptr + q_off, mask=row_valid[:, None] & dmask[None, :], other=0.0)

    # keys any row of the tile can see: [j_lo, j_end)
    tile_has_rows = q_start < n
    last_pos = first_pos + tl.minimum(q_start + BLOCK_Q, n) - 1
    j_end = tl.where(tile_has_rows, last_pos + 1, 0)
    j_lo = tl.where(sliding_window > 0, tl.maximum(first_pos + q_start - sliding_window + 1, 0), 0)
    start = (j_lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for j0 in range(start, j_end, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        jvalid = (j >= j_lo) & (j < j_end)
        blk = tl.load(block_tables_ptr + s * stride_bt + j // BLOCK_SIZE, mask=jvalid, other=0)
        slot = blk * BLOCK_SIZE + j % BLOCK_SIZE
        kv_off = slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE) + kvh * HEAD_SIZE + d[None, :]
        kv_mask = jvalid[:, None] & dmask[None, :]
        k = tl.load(key_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)  # [N, D]
        scores = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [M, N]
        visible = jvalid[None, :] & (j[None, :] <= pos[:, None])
        visible = visible & ((sliding_window == 0) | (j[None, :] > pos[:, None] - sliding_window))
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(value_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_off = t[:, None] * stride_out + h[:, None] * HEAD_SIZE + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dmask[None, :])


@triton.jit
def int4_gemm_kernel(
    a_ptr,  # [M, K] fp16|fp32, rows stride_am apart
    b_ptr,  # [N, K/G, G/2] uint8 == [N, K/2] bytes, MatMulNBits nibble order
    scales_ptr,  # [N, K/G] fp16|fp32
    zp_ptr,  # ZP_MODE 1: uint8 [N, ceil(K/G/2)]; 2: float [N, K/G]; 0: unused
    y_ptr,  # [M, N], rows stride_ym apart
    M,
    N,
    K,
    stride_am,
    stride_ym,
    GROUP: tl.constexpr,  # quantization block size G along K
    ZP_MODE: tl.constexpr,  # 0 none (8), 1 packed uint8, 2 float
    BLOCK_M: tl.constexpr,  # >= 16
    BLOCK_N: tl.constexpr,  # >= 16
    BLOCK_K: tl.constexpr,  # >= 16, divides GROUP (one scale per column per K tile)
    INPUT_PRECISION: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). W tile [BLOCK_K, BLOCK_N] is dequantized in
    registers as (q - zp) * scale in fp32, cast to A's dtype, then tl.dot with fp32 accumulate."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    mmask = rm < M
    nmask = rn < N
    num_blocks = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    shift = (rk % 2) * 4  # even element: low nibble
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :], mask=mmask[:, None], other=0.0)
        byte = tl.load(b_ptr + rn[None, :] * (K // 2) + (kk // 2)[:, None], mask=nmask[None, :], other=0)
        q = ((byte.to(tl.int32) >> shift[:, None]) & 0xF).to(tl.float32)  # [BK, BN]
        blk = k0 // GROUP
        sc = tl.load(scales_ptr + rn * num_blocks + blk, mask=nmask, other=0.0).to(tl.float32)
        if ZP_MODE == 0:
            w = (q - 8.0) * sc[None, :]
        elif ZP_MODE == 1:
            zbyte = tl.load(zp_ptr + rn * ((num_blocks + 1) // 2) + blk // 2, mask=nmask, other=0)
            z = ((zbyte.to(tl.int32) >> ((blk % 2) * 4)) & 0xF).to(tl.float32)
            w = (q - z[None, :]) * sc[None, :]
        else:
            z = tl.load(zp_ptr + rn * num_blocks + blk, mask=nmask, other=0.0).to(tl.float32)
            w = (q - z[None, :]) * sc[None, :]
        acc += tl.dot(a, w.to(a.dtype), input_precision=INPUT_PRECISION)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


# ============================================================================================
# launchers (torch tensors on the kernel's device; CPU tensors under TRITON_INTERPRET=1)
# ============================================================================================


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _precision(dtype: Any, input_precision: str | None) -> str:
    import torch

    if input_precision is not None:
        return input_precision
    return "ieee" if dtype == torch.float32 else "tf32"  # fp16 ignores it


def _attention_attrs(num_heads: int, num_kv_heads: int, head_size: int, scale: float, block_size: int,
                     sliding_window: int) -> tuple[int, float]:
    for name, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_size", head_size),
                    ("block_size", block_size)):
        if int(v) <= 0:
            raise OpError(f"attribute {name}={v}, expected a positive integer")
    if num_heads % num_kv_heads:
        raise OpError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if sliding_window < 0:
        raise OpError(f"attribute sliding_window={sliding_window}, expected >= 0 (0 = off)")
    return num_heads // num_kv_heads, (float(scale) or 1.0 / math.sqrt(head_size))


def _check_cache(key_cache: Any, value_cache: Any, block_size: int, num_kv_heads: int, head_size: int) -> None:
    want = (block_size, num_kv_heads, head_size)
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if c.dim() != 4 or tuple(c.shape[1:]) != want or not c.is_contiguous():
            raise OpError(f"{name}: shape {tuple(c.shape)}, expected a contiguous [NB, {block_size}, "
                          f"{num_kv_heads}, {head_size}]")


def write_kv_cache(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any) -> None:
    """Write K/V rows ``[T, KVH*D]`` into the caches ``[NB, BS, KVH, D]`` at ``slot_mapping [T]``
    (int64), in place. Negative slots are skipped."""
    T = key.shape[0]
    kvh_d = key_cache.shape[2] * key_cache.shape[3]
    if key.shape != (T, kvh_d) or value.shape != (T, kvh_d) or slot_mapping.shape != (T,):
        raise OpError(f"write_kv_cache: key {tuple(key.shape)}, value {tuple(value.shape)}, slot_mapping "
                      f"{tuple(slot_mapping.shape)}; expected [T, {kvh_d}], [T, {kvh_d}], [T]")
    if T == 0:
        return
    if key.stride(1) != 1 or value.stride(1) != 1:
        raise OpError("write_kv_cache: key/value rows must be contiguous in their last dim")
    write_kv_cache_kernel[(T,)](key, value, key_cache, value_cache, slot_mapping, key.stride(0),
                                value.stride(0), KVH_D=kvh_d, BLOCK=_next_pow2(kvh_d))


def paged_attention_decode(query: Any, key_cache: Any, value_cache: Any, block_tables: Any, context_lens: Any,
                           *, num_heads: int, num_kv_heads: int, head_size: int, scale: float = 0.0,
                           block_size: int, sliding_window: int = 0, out: Any = None,
                           block_n: int | None = None) -> Any:
    """Decode attention: ``query [S, H*D]`` (token s is sequence s's newest token, position
    ``context_lens[s]-1``, its K/V already in the pool) -> ``out [S, H*D]`` in query's dtype."""
    import torch

    group, scale = _attention_attrs(num_heads, num_kv_heads, head_size, scale, block_size, sliding_window)
    _check_cache(key_cache, value_cache, block_size, num_kv_heads, head_size)
    S = block_tables.shape[0]
    if query.shape != (S, num_heads * head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [S, H*D] = [{S}, {num_heads * head_size}]")
    out = torch.empty_like(query) if out is None else out
    if S == 0:
        return out
    gp, dp = _next_pow2(group), max(16, _next_pow2(head_size))
    bn = block_n or max(16, min(64, _next_pow2(max(1, 8192 // (gp * dp)))))
    paged_attention_decode_kernel[(S, num_kv_heads)](
        out, query, key_cache, value_cache, block_tables, context_lens, scale, int(sliding_window),
        query.stride(0), out.stride(0), block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_SIZE=head_size, BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=gp,
        D_PAD=dp, BLOCK_N=bn)
    return out


def paged_attention_prefill(query: Any, key_cache: Any, value_cache: Any, block_tables: Any, context_lens: Any,
                            query_start_loc: Any, *, num_heads: int, num_kv_heads: int, head_size: int,
                            scale: float = 0.0, block_size: int, sliding_window: int = 0, out: Any = None,
                            block_q: int | None = None, block_n: int = 32,
                            input_precision: str | None = None) -> Any:
    """Prefill attention over packed ragged chunks (``query [T, H*D]``, ``query_start_loc
    [S+1]``), this step's K/V already in the pool. ``out [T, H*D]`` in query's dtype."""
    import torch

    group, scale = _attention_attrs(num_heads, num_kv_heads, head_size, scale, block_size, sliding_window)
    _check_cache(key_cache, value_cache, block_size, num_kv_heads, head_size)
    T, S = query.shape[0], block_tables.shape[0]
    if query.shape != (T, num_heads * head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [T, H*D] = [T, {num_heads * head_size}]")
    if query_start_loc.shape != (S + 1,):
        raise OpError(f"query_start_loc: shape {tuple(query_start_loc.shape)}, expected [S+1] = [{S + 1}]")
    out = torch.empty_like(query) if out is None else out
    if T == 0 or S == 0:
        return out
    gp, dp = _next_pow2(group), max(16, _next_pow2(head_size))
    bq = block_q or max(1, 64 // gp)
    if bq * gp < 16 or block_n < 16 or bq & (bq - 1) or block_n & (block_n - 1):
        raise OpError(f"block_q={bq} x group {gp} must give >= 16 rows; block_n={block_n} >= 16; powers of two")
    grid = (T // bq + S, num_kv_heads)
    paged_attention_prefill_kernel[grid](
        out, query, key_cache, value_cache, block_tables, context_lens, query_start_loc, S, scale,
        int(sliding_window), query.stride(0), out.stride(0), block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_SIZE=head_size, BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=gp,
        D_PAD=dp, BLOCK_Q=bq, BLOCK_N=block_n, INPUT_PRECISION=_precision(query.dtype, input_precision))
    return out


def paged_attention(query: Any, key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
                    block_tables: Any, context_lens: Any, query_start_loc: Any, *, num_heads: int,
                    num_kv_heads: int, head_size: int, scale: float = 0.0, block_size: int,
                    sliding_window: int = 0, max_query_len: int | None = None) -> tuple[Any, Any, Any]:
    """``trtpipe::PagedAttention`` on torch tensors: write K/V in place, then attention.

    Returns ``(output, key_cache, value_cache)`` with the caches being the (updated) inputs,
    the in-place aliasing backends use. ``max_query_len == 1`` (decode batch: one token per
    sequence, ``T == S``) selects the decode kernel; None reads it from query_start_loc (a host
    sync).
    """
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    kw = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, scale=scale,
              block_size=block_size, sliding_window=sliding_window)
    S = block_tables.shape[0]
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item()) if S else 0
    if max_query_len == 1 and query.shape[0] == S:
        out = paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, **kw)
    else:
        out = paged_attention_prefill(query, key_cache, value_cache, block_tables, context_lens,
                                      query_start_loc, **kw)
    return out, key_cache, value_cache


def int4_gemm(a: Any, b_packed: Any, scales: Any, zero_points: Any = None, *, K: int, N: int, group_size: int,
              bits: int = 4, block_m: int = 16, block_n: int = 32, block_k: int | None = None,
              input_precision: str | None = None) -> Any:
    """``trtpipe::Int4Gemm`` on torch tensors: ``a [..., K]`` -> ``y [..., N]`` in a's dtype.

    ``b_packed [N, K/G, G/2]`` uint8, ``scales [N, K/G]``, ``zero_points`` None | uint8
    ``[N, ceil(K/G/2)]`` | float ``[N, K/G]`` (see :func:`trtpipe.plugins.reference.int4_gemm`).
    """
    import torch

    if bits != 4:
        raise OpError(f"attribute bits={bits}: Int4Gemm supports bits=4 only")
    check_group_size(K, group_size)
    G, nb = int(group_size), K // int(group_size)
    if a.shape[-1] != K:
        raise OpError(f"A: shape {tuple(a.shape)}, expected [..., K] with K={K}")
    if tuple(b_packed.shape) != (N, nb, G // 2) or b_packed.dtype != torch.uint8 or not b_packed.is_contiguous():
        raise OpError(f"b_packed: {tuple(b_packed.shape)} {b_packed.dtype}, expected contiguous uint8 "
                      f"[{N}, {nb}, {G // 2}]")
    if tuple(scales.shape) != (N, nb) or not scales.is_contiguous():
        raise OpError(f"scales: shape {tuple(scales.shape)}, expected contiguous [{N}, {nb}]")
    if zero_points is None:
        zp_mode, zp = 0, scales
    elif zero_points.dtype == torch.uint8:
        if tuple(zero_points.shape) != (N, (nb + 1) // 2):
            raise OpError(f"zero_points: shape {tuple(zero_points.shape)}, expected uint8 [{N}, {(nb + 1) // 2}]")
        zp_mode, zp = 1, zero_points.contiguous()
    else:
        if tuple(zero_points.shape) != (N, nb):
            raise OpError(f"zero_points: shape {tuple(zero_points.shape)}, expected float [{N}, {nb}]")
        zp_mode, zp = 2, zero_points.contiguous()
    bk = block_k or min(G, 64)
    if G % bk or bk < 16:
        raise OpError(f"block_k={bk} must be >= 16 and divide group_size={G}")
    a2 = a.reshape(-1, K)
    if a2.stride(1) != 1:
        a2 = a2.contiguous()
    M = a2.shape[0]
    y = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M:
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
        int4_gemm_kernel[grid](a2, b_packed, scales, zp, y, M, N, K, a2.stride(0), y.stride(0), GROUP=G,
                               ZP_MODE=zp_mode, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
                               INPUT_PRECISION=_precision(a.dtype, input_precision))
    return y.reshape(*a.shape[:-1], N)


# ============================================================================================
# ahead-of-time compilation (no GPU needed): cubin/PTX for the TensorRT plugins
# ============================================================================================

_F = {"fp16": "*fp16", "fp32": "*fp32"}

# name -> (kernel, signature builder (dtype -> {arg: type}), default constexprs)
AOT_KERNELS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "write_kv_cache": (
        write_kv_cache_kernel,
        lambda dt: {"key_ptr": _F[dt], "value_ptr": _F[dt], "key_cache_ptr": _F[dt], "value_cache_ptr": _F[dt],
                    "slot_mapping_ptr": "*i64", "stride_key_t": "i64", "stride_value_t": "i64",
                    "KVH_D": "constexpr", "BLOCK": "constexpr"},
        {"KVH_D": 3 * 64, "BLOCK": 256},
    ),
    "paged_attention_decode": (
        paged_attention_decode_kernel,
        lambda dt: {"out_ptr": _F[dt], "query_ptr": _F[dt], "key_cache_ptr": _F[dt], "value_cache_ptr": _F[dt],
                    "block_tables_ptr": "*i64", "context_lens_ptr": "*i64", "scale": "fp32",
                    "sliding_window": "i32", "stride_q": "i64", "stride_out": "i64", "stride_bt": "i64",
                    **{k: "constexpr" for k in ("NUM_KV_HEADS", "HEAD_SIZE", "BLOCK_SIZE", "GROUP", "GROUP_PAD",
                                                "D_PAD", "BLOCK_N")}},
        {"NUM_KV_HEADS": 3, "HEAD_SIZE": 64, "BLOCK_SIZE": 16, "GROUP": 3, "GROUP_PAD": 4, "D_PAD": 64,
         "BLOCK_N": 32},
    ),
    "paged_attention_prefill": (
        paged_attention_prefill_kernel,
        lambda dt: {"out_ptr": _F[dt], "query_ptr": _F[dt], "key_cache_ptr": _F[dt], "value_cache_ptr": _F[dt],
                    "block_tables_ptr": "*i64", "context_lens_ptr": "*i64", "query_start_loc_ptr": "*i64",
                    "num_seqs": "i32", "scale": "fp32", "sliding_window": "i32", "stride_q": "i64",
                    "stride_out": "i64", "stride_bt": "i64",
                    **{k: "constexpr" for k in ("NUM_KV_HEADS", "HEAD_SIZE", "BLOCK_SIZE", "GROUP", "GROUP_PAD",
                                                "D_PAD", "BLOCK_Q", "BLOCK_N", "INPUT_PRECISION")}},
        {"NUM_KV_HEADS": 3, "HEAD_SIZE": 64, "BLOCK_SIZE": 16, "GROUP": 3, "GROUP_PAD": 4, "D_PAD": 64,
         "BLOCK_Q": 16, "BLOCK_N": 32, "INPUT_PRECISION": "tf32"},
    ),
    "int4_gemm": (
        int4_gemm_kernel,
        lambda dt: {"a_ptr": _F[dt], "b_ptr": "*u8", "scales_ptr": _F[dt], "zp_ptr": "*u8", "y_ptr": _F[dt],
                    "M": "i32", "N": "i32", "K": "i32", "stride_am": "i64", "stride_ym": "i64",
                    **{k: "constexpr" for k in ("GROUP", "ZP_MODE", "BLOCK_M", "BLOCK_N", "BLOCK_K",
                                                "INPUT_PRECISION")}},
        {"GROUP": 32, "ZP_MODE": 1, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "INPUT_PRECISION": "tf32"},
    ),
}


def aot_compile(name: str, *, cc: int, dtype: str = "fp16", num_warps: int = 4, fp_fusion: bool = True,
                **constexprs: Any) -> Any:
    """Compile kernel ``name`` of :data:`AOT_KERNELS` for ``sm_<cc>`` without a GPU.

    ``dtype`` ("fp16" | "fp32") types the float pointers; ``constexprs`` override the defaults
    (the SmolLM2 shapes: 3 kv heads, head 64, page 16); for ``int4_gemm`` with ``ZP_MODE=2``
    the zero-point pointer takes the float ``dtype``. ``fp_fusion`` allows FMA contraction
    (triton's current default, stated explicitly). Returns triton's ``CompiledKernel``:
    ``.asm["cubin"]`` (bytes), ``.asm["ptx"]`` (str), ``.metadata`` (name, shared memory,
    num_warps) -- what a TensorRT ``aot_impl`` embeds.

    Raises:
        OpError: unknown kernel name or dtype.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if name not in AOT_KERNELS:
        raise OpError(f"unknown kernel {name!r}; expected one of {sorted(AOT_KERNELS)}")
    if dtype not in _F:
        raise OpError(f"dtype={dtype!r}, expected one of {sorted(_F)}")
    fn, signature, defaults = AOT_KERNELS[name]
    sig = signature(dtype)
    consts = {**defaults, **constexprs}
    if name == "int4_gemm" and consts["ZP_MODE"] == 2:
        sig["zp_ptr"] = _F[dtype]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    options = {"num_warps": num_warps, "enable_fp_fusion": fp_fusion}
    return triton.compile(src, target=GPUTarget("cuda", int(cc), 32), options=options)
