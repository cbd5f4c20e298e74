"""Launchers of the Triton kernels (:mod:`trtpipe.plugins.ops.paged_attention.triton_kernels`) on torch tensors.

Each launcher checks shapes and attributes, picks the block sizes and grid, and launches its
kernel on the tensors' device (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``, which is how
the tests run them against :mod:`trtpipe.plugins.ops.paged_attention.reference` without a GPU; ``bench/gpu_check.py``
runs them on a GPU). The TensorRT plugins do not use these: they launch AOT-compiled wrapper
kernels (:mod:`trtpipe.plugins.ops.trt_plugins`).

Imports triton at module level and torch inside the launchers; build/bench side only.
"""

from __future__ import annotations

import math
from typing import Any

import triton

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm.pack import check_group_size
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    int4_gemm_kernel,
    next_pow2,
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_kernel,
)

__all__ = ["write_kv_cache", "paged_attention_decode", "paged_attention_prefill", "paged_attention", "int4_gemm"]


def _precision(dtype: Any, input_precision: str | None) -> str:
    import torch

    if input_precision is not None:
        return input_precision
    return "ieee" if dtype == torch.float32 else "tf32"  # fp16 ignores it


def _attention_attrs(
    num_heads: int, num_kv_heads: int, head_size: int, scale: float, block_size: int, sliding_window: int
) -> tuple[int, float]:
    for name, v in (
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_size", head_size),
        ("block_size", block_size),
    ):
        if int(v) <= 0:
            raise OpError(f"attribute {name}={v}, expected a positive integer")
    if num_heads % num_kv_heads:
        raise OpError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if sliding_window < 0:
        raise OpError(f"attribute sliding_window={sliding_window}, expected >= 0 (0 = off)")
    return num_heads // num_kv_heads, (float(scale) or 1.0 / math.sqrt(head_size))


def _check_cache(key_cache: Any, value_cache: Any, block_size: int, num_kv_heads: int, head_size: int) -> int:
    """Check both caches are contiguous head-major ``[KVH, NB, BS, D]`` pools of one shape and
    return ``stride_cache_head`` (``NB * BS * D`` elements between kv heads). Raises
    :class:`OpError` naming the cache, its shape and the expected one."""
    want = f"a contiguous [num_kv_heads, NB, block_size, head_size] = [{num_kv_heads}, NB, {block_size}, {head_size}]"
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        head_major = c.dim() == 4 and c.shape[0] == num_kv_heads and tuple(c.shape[2:]) == (block_size, head_size)
        if not head_major or not c.is_contiguous():
            layout = "" if c.dim() != 4 or c.is_contiguous() else " (not contiguous)"
            raise OpError(f"{name}: shape {tuple(c.shape)}{layout}, expected {want} (head-major KV pool)")
    if value_cache.shape != key_cache.shape:
        raise OpError(
            f"value_cache: shape {tuple(value_cache.shape)}, expected the key_cache shape {tuple(key_cache.shape)}"
        )
    return int(key_cache.stride(0))


def write_kv_cache(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any) -> None:
    """Write K/V rows ``[T, KVH*D]`` into the head-major caches ``[KVH, NB, BS, D]`` at
    ``slot_mapping [T]`` (int64), in place: kv head h of token t lands at
    ``cache[h, slot // BS, slot % BS]``. Negative slots are skipped. Raises :class:`OpError` on
    a shape mismatch or a non-contiguous cache."""
    T = key.shape[0]
    if key_cache.dim() != 4:
        raise OpError(f"key_cache: shape {tuple(key_cache.shape)}, expected [num_kv_heads, NB, block_size, head_size]")
    kvh, _, bs, d = (int(x) for x in key_cache.shape)
    stride_cache_head = _check_cache(key_cache, value_cache, bs, kvh, d)
    kvh_d = kvh * d
    if key.shape != (T, kvh_d) or value.shape != (T, kvh_d) or slot_mapping.shape != (T,):
        raise OpError(
            f"write_kv_cache: key {tuple(key.shape)}, value {tuple(value.shape)}, slot_mapping "
            f"{tuple(slot_mapping.shape)}; expected [T, {kvh_d}], [T, {kvh_d}], [T]"
        )
    if T == 0:
        return
    if key.stride(1) != 1 or value.stride(1) != 1:
        raise OpError("write_kv_cache: key/value rows must be contiguous in their last dim")
    write_kv_cache_kernel[(T,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        stride_cache_head,
        KVH_D=kvh_d,
        HEAD_SIZE=d,
        BLOCK=next_pow2(kvh_d),
    )


def paged_attention_decode(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    context_lens: Any,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float = 0.0,
    block_size: int,
    sliding_window: int = 0,
    out: Any = None,
    block_n: int | None = None,
) -> Any:
    """Decode attention: ``query [S, H*D]`` (token s is sequence s's newest token, position
    ``context_lens[s]-1``, its K/V already in the head-major pool ``[KVH, NB, BS, D]``) ->
    ``out [S, H*D]`` in query's dtype."""
    import torch

    group, scale = _attention_attrs(num_heads, num_kv_heads, head_size, scale, block_size, sliding_window)
    stride_cache_head = _check_cache(key_cache, value_cache, block_size, num_kv_heads, head_size)
    S = block_tables.shape[0]
    if query.shape != (S, num_heads * head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [S, H*D] = [{S}, {num_heads * head_size}]")
    out = torch.empty_like(query) if out is None else out
    if S == 0:
        return out
    gp, dp = next_pow2(group), max(16, next_pow2(head_size))
    bn = block_n or max(16, min(64, next_pow2(max(1, 8192 // (gp * dp)))))
    paged_attention_decode_kernel[(S, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        scale,
        int(sliding_window),
        query.stride(0),
        out.stride(0),
        block_tables.stride(0),
        stride_cache_head,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=gp,
        D_PAD=dp,
        BLOCK_N=bn,
    )
    return out


def _prefill_tiles(group: int, head_size: int, block_q: int | None, block_n: int) -> tuple[int, int, int]:
    """``(GROUP_PAD, D_PAD, BLOCK_Q)`` of the prefill kernel; ``block_q`` None: 64 rows per tile.
    Raises :class:`OpError` unless BLOCK_Q x GROUP_PAD >= 16 (``tl.dot``), block_n >= 16, both powers of two."""
    gp, dp = next_pow2(group), max(16, next_pow2(head_size))
    bq = block_q or max(1, 64 // gp)
    if bq * gp < 16 or block_n < 16 or bq & (bq - 1) or block_n & (block_n - 1):
        raise OpError(f"block_q={bq} x group {gp} must give >= 16 rows; block_n={block_n} >= 16; powers of two")
    return gp, dp, bq


def paged_attention_prefill(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    context_lens: Any,
    query_start_loc: Any,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float = 0.0,
    block_size: int,
    sliding_window: int = 0,
    out: Any = None,
    block_q: int | None = None,
    block_n: int = 32,
    input_precision: str | None = None,
) -> Any:
    """Prefill attention over packed ragged chunks (``query [T, H*D]``, ``query_start_loc
    [S+1]``), this step's K/V already in the head-major pool ``[KVH, NB, BS, D]``. ``out [T, H*D]``
    in query's dtype."""
    import torch

    group, scale = _attention_attrs(num_heads, num_kv_heads, head_size, scale, block_size, sliding_window)
    stride_cache_head = _check_cache(key_cache, value_cache, block_size, num_kv_heads, head_size)
    T, S = query.shape[0], block_tables.shape[0]
    if query.shape != (T, num_heads * head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [T, H*D] = [T, {num_heads * head_size}]")
    if query_start_loc.shape != (S + 1,):
        raise OpError(f"query_start_loc: shape {tuple(query_start_loc.shape)}, expected [S+1] = [{S + 1}]")
    out = torch.empty_like(query) if out is None else out
    if T == 0 or S == 0:
        return out
    gp, dp, bq = _prefill_tiles(group, head_size, block_q, block_n)
    grid = (T // bq + S, num_kv_heads)
    paged_attention_prefill_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        query_start_loc,
        S,
        scale,
        int(sliding_window),
        query.stride(0),
        out.stride(0),
        block_tables.stride(0),
        stride_cache_head,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=gp,
        D_PAD=dp,
        BLOCK_Q=bq,
        BLOCK_N=block_n,
        INPUT_PRECISION=_precision(query.dtype, input_precision),
    )
    return out


def paged_attention(
    query: Any,
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    block_tables: Any,
    context_lens: Any,
    query_start_loc: Any,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float = 0.0,
    block_size: int,
    sliding_window: int = 0,
    max_query_len: int | None = None,
) -> tuple[Any, Any, Any]:
    """``trtpipe::PagedAttention`` on torch tensors (caches head-major ``[KVH, NB, BS, D]``,
    contiguous): write K/V in place, then attention.

    Returns ``(output, key_cache, value_cache)`` with the caches being the (updated) inputs,
    the in-place aliasing backends use. ``max_query_len == 1`` (decode batch: one token per
    sequence, ``T == S``) selects the decode kernel; None reads it from query_start_loc (a host
    sync).
    """
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    S = block_tables.shape[0]
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item()) if S else 0
    if max_query_len == 1 and query.shape[0] == S:
        out = paged_attention_decode(
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            scale=scale,
            block_size=block_size,
            sliding_window=sliding_window,
        )
    else:
        out = paged_attention_prefill(
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            query_start_loc,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            scale=scale,
            block_size=block_size,
            sliding_window=sliding_window,
        )
    return out, key_cache, value_cache


def _zero_point_mode(zero_points: Any, scales: Any, N: int, nb: int) -> tuple[int, Any]:
    """``(ZP_MODE, zero-point tensor)`` of the Int4Gemm kernel: 0 (none: 8; scales stand in for the
    unused pointer), 1 (packed uint8 ``[N, ceil(nb/2)]``), 2 (float ``[N, nb]``). Raises
    :class:`OpError` on a shape mismatch."""
    import torch

    if zero_points is None:
        return 0, scales
    if zero_points.dtype == torch.uint8:
        if tuple(zero_points.shape) != (N, (nb + 1) // 2):
            raise OpError(f"zero_points: shape {tuple(zero_points.shape)}, expected uint8 [{N}, {(nb + 1) // 2}]")
        return 1, zero_points.contiguous()
    if tuple(zero_points.shape) != (N, nb):
        raise OpError(f"zero_points: shape {tuple(zero_points.shape)}, expected float [{N}, {nb}]")
    return 2, zero_points.contiguous()


def int4_gemm(
    a: Any,
    b_packed: Any,
    scales: Any,
    zero_points: Any = None,
    *,
    K: int,
    N: int,
    group_size: int,
    bits: int = 4,
    block_m: int = 16,
    block_n: int = 32,
    block_k: int | None = None,
    input_precision: str | None = None,
) -> Any:
    """``trtpipe::Int4Gemm`` on torch tensors: ``a [..., K]`` -> ``y [..., N]`` in a's dtype.

    ``b_packed [N, K/G, G/2]`` uint8, ``scales [N, K/G]``, ``zero_points`` None | uint8
    ``[N, ceil(K/G/2)]`` | float ``[N, K/G]`` (see :func:`trtpipe.plugins.ops.paged_attention.reference.int4_gemm`).
    """
    import torch

    if bits != 4:
        raise OpError(f"attribute bits={bits}: Int4Gemm supports bits=4 only")
    check_group_size(K, group_size)
    G, nb = int(group_size), K // int(group_size)
    if a.shape[-1] != K:
        raise OpError(f"A: shape {tuple(a.shape)}, expected [..., K] with K={K}")
    if tuple(b_packed.shape) != (N, nb, G // 2) or b_packed.dtype != torch.uint8 or not b_packed.is_contiguous():
        raise OpError(
            f"b_packed: {tuple(b_packed.shape)} {b_packed.dtype}, expected contiguous uint8 [{N}, {nb}, {G // 2}]"
        )
    if tuple(scales.shape) != (N, nb) or not scales.is_contiguous():
        raise OpError(f"scales: shape {tuple(scales.shape)}, expected contiguous [{N}, {nb}]")
    zp_mode, zp = _zero_point_mode(zero_points, scales, N, nb)
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
        int4_gemm_kernel[grid](
            a2,
            b_packed,
            scales,
            zp,
            y,
            M,
            N,
            K,
            a2.stride(0),
            y.stride(0),
            GROUP=G,
            ZP_MODE=zp_mode,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=bk,
            INPUT_PRECISION=_precision(a.dtype, input_precision),
        )
    return y.reshape(*a.shape[:-1], N)
