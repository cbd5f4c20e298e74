"""Triton kernels of ``trtpipe::PagedAttention``, for the GPU backends (TensorRT plugins, AOT).

Kernels (each with a launcher that takes torch tensors in :mod:`trtpipe.plugins.ops.paged_attention.triton_launch`,
and an AOT entry in :data:`trtpipe.plugins.triton.aot.AOT_KERNELS`; Int4Gemm's kernel is in
:mod:`trtpipe.plugins.ops.int4_gemm.triton_kernels`):

- :func:`write_kv_cache_kernel` -- vLLM ``reshape_and_cache``: writes this step's K/V rows into
  the paged pool at ``slot_mapping`` (the "write first" half of ``trtpipe::PagedAttention``);
  :func:`write_kv_cache_int8_kernel` the same into an int8 pool with its per token-head scales.
  The attention kernels read fp32 / fp16 / bf16 pools as their element type and an int8 pool
  times its scales (``KV_INT8``; :mod:`trtpipe.plugins.core.kv_codec` defines the encodings).
- :func:`paged_attention_decode_kernel` -- one query token per sequence; one program per
  (sequence, kv head) handles the whole GQA group; online softmax over the sequence's keys
  read through its block table (vLLM paged attention v1 / flash-decoding without the split).
- :func:`paged_attention_prefill_kernel` -- ragged packed query chunks (prefill, chunked
  prefill, prefix reuse); one program per (query tile, kv head); rows = BLOCK_Q tokens x
  GROUP query heads, so K/V tiles are loaded once per GQA group and multiplied with ``tl.dot``.
  Query tiles are mapped to sequences by a binary search over ``qsl[s] // BLOCK_Q + s``
  (the vLLM Triton unified-attention scheme), so the grid ``T // BLOCK_Q + S`` needs no host
  sync.

Their tiles (constexprs, block sizes) are chosen on the host by
:mod:`trtpipe.plugins.ops.paged_attention.tiles`, for the launchers and the TensorRT plugin kernels alike.

Semantics are defined by :mod:`trtpipe.plugins.ops.paged_attention.reference` (see ``docs/contracts.md``);
tests run these kernels under ``TRITON_INTERPRET=1`` against it and compile them to
cubin/PTX for sm_80 / sm_87 / sm_90 without a GPU (:func:`trtpipe.plugins.triton.aot.aot_compile`).

Numerics: softmax, scores and accumulators are float32. ``tl.dot`` runs on the input dtype
(fp16 -> tensor cores, fp32 accumulate); float32 inputs use ``input_precision="ieee"``
by default (no TF32 truncation), overridable with ``input_precision``.

KV pool (per layer, docs/contracts.md): head-major ``[KVH, NB, BS, D]`` contiguous, so kv head
``h`` of slot ``s`` starts at element ``h * stride_cache_head + s * D`` with ``stride_cache_head =
NB * BS * D`` (a runtime argument: the pool size is not a compile-time constant). Offsets are
computed in int64 (block tables and slots are int64; the kv head index is widened before it
multiplies the head stride, so pools over 2**31 elements address correctly).

This module imports triton at module level (it is the Triton module; import it lazily), never
torch. It is a plugin ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`). Exception
to the 60-line rule: the two attention kernels (``paged_attention_decode_kernel``,
``paged_attention_prefill_kernel``) are single ``@triton.jit`` bodies (Triton inlines
helpers anyway; splitting them would hide the tiling in call boundaries).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "write_kv_cache_kernel",
    "write_kv_cache_int8_kernel",
    "paged_attention_decode_kernel",
    "paged_attention_prefill_kernel",
]


# ============================================================================================
# kernels
# ============================================================================================


@triton.jit
def write_kv_cache_kernel(
    key_ptr,  # [T, KVH*D] rows of this step's K
    value_ptr,  # [T, KVH*D]
    key_cache_ptr,  # [KVH, NB, BS, D] contiguous (head-major)
    value_cache_ptr,  # [KVH, NB, BS, D] contiguous
    slot_mapping_ptr,  # [T] int64
    stride_key_t,  # elements between rows of key
    stride_value_t,
    stride_cache_head,  # elements between kv heads of the pool: NB * BS * D
    KVH_D: tl.constexpr,  # num_kv_heads * head_size
    HEAD_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of two >= KVH_D
):
    """Grid (T,). Token t's K/V row (kv head h = element // D) goes to slot slot_mapping[t] of
    head h: element ``h * stride_cache_head + slot * D + element % D``; a negative slot is
    skipped (vLLM's padding convention; the reference rejects it)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t)
    offs = tl.arange(0, BLOCK)
    mask = (offs < KVH_D) & ((offs * 0 + slot) >= 0)  # explicit broadcast (interpreter)
    k = tl.load(key_ptr + t * stride_key_t + offs, mask=mask)
    v = tl.load(value_ptr + t * stride_value_t + offs, mask=mask)
    head = (offs // HEAD_SIZE).to(tl.int64)
    dst = head * stride_cache_head + slot * HEAD_SIZE + offs % HEAD_SIZE
    tl.store(key_cache_ptr + dst, _to_pool(k, key_cache_ptr), mask=mask)
    tl.store(value_cache_ptr + dst, _to_pool(v, value_cache_ptr), mask=mask)


@triton.jit
def _to_pool(x, cache_ptr):
    """``x`` in the pool's element type. bf16 rounds to nearest even on the bits (kv_codec.bf16_bits;
    the interpreter's cast truncates, the GPU's rounds: the same bits either way)."""
    if cache_ptr.dtype.element_ty == tl.bfloat16:
        u = x.to(tl.float32).to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def write_kv_cache_int8_kernel(
    key_ptr,  # [T, KVH*D] rows of this step's K
    value_ptr,  # [T, KVH*D]
    key_cache_ptr,  # [KVH, NB, BS, D] int8, contiguous (head-major)
    value_cache_ptr,
    key_scale_ptr,  # [KVH, NB, BS] float32: one scale per token and kv head
    value_scale_ptr,
    slot_mapping_ptr,  # [T] int64
    stride_key_t,
    stride_value_t,
    stride_cache_head,  # elements between kv heads of the pool: NB * BS * D
    HEAD_SIZE: tl.constexpr,
    D_PAD: tl.constexpr,  # next power of two >= HEAD_SIZE
):
    """Grid (T, KVH). Token t's kv head h row, int8-encoded as :mod:`trtpipe.plugins.core.kv_codec`
    defines it (``scale = amax / 127``, ``q = rint(x * (127 / amax))`` clipped, 0 for a zero
    row), at slot ``slot_mapping[t]``; its scale at ``h * NB * BS + slot``. A negative slot is
    skipped."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t)
    d = tl.arange(0, D_PAD)
    mask = (d < HEAD_SIZE) & ((d * 0 + slot) >= 0)
    dst = h * stride_cache_head + slot * HEAD_SIZE + d
    scale_dst = h * (stride_cache_head // HEAD_SIZE) + slot
    k = tl.load(key_ptr + t * stride_key_t + h * HEAD_SIZE + d, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(value_ptr + t * stride_value_t + h * HEAD_SIZE + d, mask=mask, other=0.0).to(tl.float32)
    kq, ks = _int8_row(k)
    vq, vs = _int8_row(v)
    tl.store(key_cache_ptr + dst, kq, mask=mask)
    tl.store(value_cache_ptr + dst, vq, mask=mask)
    tl.store(key_scale_ptr + scale_dst, ks, mask=slot >= 0)
    tl.store(value_scale_ptr + scale_dst, vs, mask=slot >= 0)


@triton.jit
def _int8_row(x):
    """``(codes [D] int8, scale)`` of a float32 row (kv_codec.kv_encode's float32 operations)."""
    amax = tl.max(tl.abs(x), axis=0)
    # div_rn: IEEE division, as NumPy's (Triton's "/" may lower to an approximate one on GPUs)
    inv = tl.where(
        amax > 0.0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.where(amax > 0.0, amax, 1.0)), 0.0
    )
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    q = tl.minimum(tl.maximum(_rint(x * inv), -127.0), 127.0)
    return q.to(tl.int8), scale


@triton.jit
def _rint(y):
    """Round half to even (``np.rint``) for ``|y| < 2**22``: ``floor(y + 0.5)`` (exact there), one
    less where ``y`` was a tie and that is odd."""
    r = tl.floor(y + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where((r - y == 0.5) & odd, r - 1.0, r)


@triton.jit
def _kv_tile(
    block_tables_ptr,
    s,
    stride_bt,
    j0,
    lo,
    hi,
    head_off,
    d,
    dmask,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keys ``j = j0 .. j0+BLOCK_N-1`` of sequence s in the kv head whose pool starts at element
    ``head_off`` (int64, ``kvh * stride_cache_head``): ``(j [N], jvalid [N] = lo <= j < hi,
    element offsets of their K/V rows in the pool [N, D_PAD], load mask, their token-head rows
    [N] = the offsets of an int8 pool's scales)``. Block table entries of invalid keys are never
    read (they may lie outside the window's blocks)."""
    j = j0 + tl.arange(0, BLOCK_N)
    jvalid = (j >= lo) & (j < hi)
    blk = tl.load(block_tables_ptr + s * stride_bt + j // BLOCK_SIZE, mask=jvalid, other=0)
    slot = blk * BLOCK_SIZE + j % BLOCK_SIZE
    kv_off = head_off + slot[:, None] * HEAD_SIZE + d[None, :]
    kv_mask = jvalid[:, None] & dmask[None, :]
    return j, jvalid, kv_off, kv_mask, head_off // HEAD_SIZE + slot


@triton.jit
def _online_softmax_init(ROWS: tl.constexpr, D_PAD: tl.constexpr):
    """``(m [ROWS] = -inf, l [ROWS] = 0, acc [ROWS, D_PAD] = 0)``, all float32."""
    return tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32), tl.zeros([ROWS, D_PAD], tl.float32)


@triton.jit
def _online_softmax_step(m_i, l_i, scores):
    """One online-softmax step (flash attention): running row max ``m_i`` and sum ``l_i`` [rows]
    updated with ``scores`` [rows, N]. Returns ``(p [rows, N] unnormalized probabilities, alpha
    [rows] rescale of the accumulator, l_i, m_new)``. A row with nothing visible yet keeps
    ``m = -inf`` (exponents taken against 0: p = 0, alpha = 1)."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    return p, alpha, l_i * alpha + tl.sum(p, axis=1), m_new


@triton.jit
def paged_attention_decode_kernel(
    out_ptr,  # [S, H*D]
    query_ptr,  # [S, H*D], token s belongs to sequence s
    key_cache_ptr,  # [KVH, NB, BS, D] contiguous (head-major)
    value_cache_ptr,
    key_scale_ptr,  # [KVH, NB, BS] float32, an int8 pool's scales (KV_INT8; else never read)
    value_scale_ptr,
    block_tables_ptr,  # [S, MB] int64
    context_lens_ptr,  # [S] int64 (query position = context_len - 1)
    scale,  # fp32 softmax scale (already resolved: never 0)
    sliding_window,  # int32, 0 = off
    stride_q,  # elements between query rows
    stride_out,
    stride_bt,  # MB
    stride_cache_head,  # elements between kv heads of the pool: NB * BS * D
    NUM_KV_HEADS: tl.constexpr,  # the grid's axis 1 (addressing uses stride_cache_head)
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # KV page size (tokens per block)
    GROUP: tl.constexpr,  # num_heads // num_kv_heads
    GROUP_PAD: tl.constexpr,  # next power of two >= GROUP
    D_PAD: tl.constexpr,  # next power of two >= HEAD_SIZE
    BLOCK_N: tl.constexpr,  # keys per iteration
    KV_INT8: tl.constexpr,  # the pool is int8: rows read times their scale (kv_codec.kv_decode)
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
    head_off = kvh.to(tl.int64) * stride_cache_head  # this kv head's [NB, BS, D] pool
    m_i, l_i, acc = _online_softmax_init(GROUP_PAD, D_PAD)  # running max, sum, weighted values
    for j0 in range(start, ctx, BLOCK_N):
        j, jvalid, kv_off, kv_mask, scale_off = _kv_tile(
            block_tables_ptr, s, stride_bt, j0, lo, ctx, head_off, d, dmask, HEAD_SIZE, BLOCK_SIZE, BLOCK_N
        )
        k = tl.load(key_cache_ptr + kv_off, mask=kv_mask, other=0).to(tl.float32)  # [N, D]
        if KV_INT8:
            k = k * tl.load(key_scale_ptr + scale_off, mask=jvalid, other=0.0)[:, None]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, N]
        scores = tl.where(jvalid[None, :], scores, float("-inf"))
        # every tile holds at least one visible key, so m_new is finite
        p, alpha, l_i, m_new = _online_softmax_step(m_i, l_i, scores)
        v = tl.load(value_cache_ptr + kv_off, mask=kv_mask, other=0).to(tl.float32)
        if KV_INT8:
            v = v * tl.load(value_scale_ptr + scale_off, mask=jvalid, other=0.0)[:, None]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # context_lens 0 (padding row) -> 0
    o_off = s * stride_out + h[:, None] * HEAD_SIZE + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])


@triton.jit
def paged_attention_prefill_kernel(
    out_ptr,  # [T, H*D]
    query_ptr,  # [T, H*D] packed ragged chunks
    key_cache_ptr,  # [KVH, NB, BS, D] contiguous (this step's K/V already written)
    value_cache_ptr,
    key_scale_ptr,  # [KVH, NB, BS] float32, an int8 pool's scales (KV_INT8; else never read)
    value_scale_ptr,
    block_tables_ptr,  # [S, MB] int64
    context_lens_ptr,  # [S] int64, tokens in the pool after this step
    query_start_loc_ptr,  # [S+1] int64
    num_seqs,  # int32 S
    scale,  # fp32 softmax scale (never 0)
    sliding_window,  # int32, 0 = off
    stride_q,
    stride_out,
    stride_bt,
    stride_cache_head,  # elements between kv heads of the pool: NB * BS * D
    NUM_KV_HEADS: tl.constexpr,  # the grid's axis 1 (addressing uses stride_cache_head)
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per tile; rows = BLOCK_Q * GROUP_PAD >= 16
    BLOCK_N: tl.constexpr,  # keys per iteration, >= 16
    INPUT_PRECISION: tl.constexpr,  # tl.dot input precision ("ieee" for exact fp32)
    KV_INT8: tl.constexpr,  # the pool is int8: rows read times their scale (kv_codec.kv_decode)
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
    # lo_s starts as a Python int but is a Triton scalar tensor after tl.where (the JIT types loop-carried
    # values); mypy sees only the int start value
    s = lo_s.to(tl.int64)  # type: ignore[attr-defined]
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
    head_off = kvh.to(tl.int64) * stride_cache_head  # this kv head's [NB, BS, D] pool

    m_i, l_i, acc = _online_softmax_init(BLOCK_M, D_PAD)  # running max, sum, weighted values
    for j0 in range(start, j_end, BLOCK_N):
        j, jvalid, kv_off, kv_mask, scale_off = _kv_tile(
            block_tables_ptr, s, stride_bt, j0, j_lo, j_end, head_off, d, dmask, HEAD_SIZE, BLOCK_SIZE, BLOCK_N
        )
        k = tl.load(key_cache_ptr + kv_off, mask=kv_mask, other=0)  # [N, D]
        if KV_INT8:
            k = k.to(tl.float32) * tl.load(key_scale_ptr + scale_off, mask=jvalid, other=0.0)[:, None]
        k = k.to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [M, N]
        visible = jvalid[None, :] & (j[None, :] <= pos[:, None])
        visible = visible & ((sliding_window == 0) | (j[None, :] > pos[:, None] - sliding_window))
        scores = tl.where(visible, scores, float("-inf"))
        p, alpha, l_i, m_new = _online_softmax_step(m_i, l_i, scores)
        v = tl.load(value_cache_ptr + kv_off, mask=kv_mask, other=0)
        if KV_INT8:
            v = v.to(tl.float32) * tl.load(value_scale_ptr + scale_off, mask=jvalid, other=0.0)[:, None]
        v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_off = t[:, None] * stride_out + h[:, None] * HEAD_SIZE + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dmask[None, :])
