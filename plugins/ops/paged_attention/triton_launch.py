"""Launchers of ``trtpipe::PagedAttention``'s Triton kernels
(:mod:`trtpipe.plugins.ops.paged_attention.triton_kernels`) on torch tensors.

Each launcher checks shapes and attributes, picks the block sizes and grid, and launches its
kernel on the tensors' device (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``, which is how
the tests run them against :mod:`trtpipe.plugins.ops.paged_attention.reference` without a GPU;
``bench/gpu_check.py`` runs them on a GPU). The attention launchers' parameter lists are the op's
description's (:data:`~trtpipe.plugins.ops.paged_attention.spec.PAGED_ATTENTION`, bound by
:meth:`~trtpipe.plugins.ops.spec.OpSpec.implement`; the decode and prefill launchers take the
inputs their kernel reads). The TensorRT plugins do not use these: they launch AOT-compiled
wrapper kernels (:mod:`trtpipe.plugins.ops.paged_attention.trt_plugin`).

Imports triton at module level and torch inside the launchers; build/bench side only.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.numerics import dot_input_precision
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION
from trtpipe.plugins.ops.paged_attention.tiles import attention_tiles, decode_block_n, next_pow2, prefill_block_q
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_int8_kernel,
    write_kv_cache_kernel,
)
from trtpipe.plugins.ops.spec import keyword

__all__ = [
    "write_kv_cache",
    "write_kv_cache_int8",
    "paged_attention_decode",
    "paged_attention_prefill",
    "paged_attention",
]

_DECODE_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "context_lens", "key_scale", "value_scale")


def _precision(dtype: Any, input_precision: str | None) -> str:
    import torch

    return input_precision or dot_input_precision("fp32" if dtype == torch.float32 else "fp16")


def _attention_attrs(a: SimpleNamespace) -> tuple[dict[str, int], float]:
    """``(tiles, scale)`` of the bound attributes ``a`` after their checks (scale 0 -> 1/sqrt(D))."""
    for name in ("num_heads", "num_kv_heads", "head_size", "block_size"):
        if int(getattr(a, name)) <= 0:
            raise OpError(f"attribute {name}={getattr(a, name)}, expected a positive integer")
    if a.num_heads % a.num_kv_heads:
        raise OpError(f"num_heads={a.num_heads} is not a multiple of num_kv_heads={a.num_kv_heads}")
    if a.sliding_window < 0:
        raise OpError(f"attribute sliding_window={a.sliding_window}, expected >= 0 (0 = off)")
    tiles = attention_tiles(a.num_heads, a.num_kv_heads, a.head_size, a.block_size)
    return tiles, (float(a.scale) or 1.0 / math.sqrt(a.head_size))


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


def _pool_and_strides(a: SimpleNamespace, out: Any, stride_cache_head: int) -> tuple[tuple, tuple, bool]:
    """The arguments both attention kernels take after ``(out, query)``: the pool, its scales
    and its index tensors ``(key_cache, value_cache, key_scale, value_scale, block_tables,
    context_lens)`` (a float pool passes its caches as the never-read scales), the strides
    ``(stride_q, stride_out, stride_bt, stride_cache_head)``, and KV_INT8. Raises
    :class:`OpError` when an int8 pool lacks its float32 ``[KVH, NB, BS]`` scales."""
    import torch

    int8 = a.key_cache.dtype == torch.int8
    if int8 and any(
        s is None or s.dtype != torch.float32 or tuple(s.shape) != tuple(a.key_cache.shape[:3]) or not s.is_contiguous()
        for s in (a.key_scale, a.value_scale)
    ):
        raise OpError(f"an int8 pool needs key_scale / value_scale float32 {list(a.key_cache.shape[:3])}, contiguous")
    scales = (a.key_scale, a.value_scale) if int8 else (a.key_cache, a.value_cache)
    pool = (a.key_cache, a.value_cache, *scales, a.block_tables, a.context_lens)
    return pool, (a.query.stride(0), out.stride(0), a.block_tables.stride(0), stride_cache_head), int8


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


def write_kv_cache_int8(
    key: Any, value: Any, key_cache: Any, value_cache: Any, key_scale: Any, value_scale: Any, slot_mapping: Any
) -> None:
    """:func:`write_kv_cache` into an int8 pool: each token-head row encoded as
    :mod:`trtpipe.plugins.core.kv_codec` defines it, its float32 scale at ``[h, slot // BS, slot %
    BS]`` of ``key_scale`` / ``value_scale`` ``[KVH, NB, BS]``. Raises :class:`OpError` on a shape
    or dtype mismatch."""
    import torch

    if key_cache.dim() != 4 or key_cache.dtype != torch.int8:
        raise OpError(f"key_cache: {key_cache.dtype} {tuple(key_cache.shape)}, expected int8 [KVH, NB, BS, D]")
    kvh, _, bs, d = (int(x) for x in key_cache.shape)
    stride_cache_head = _check_cache(key_cache, value_cache, bs, kvh, d)
    T = key.shape[0]
    for name, s in (("key_scale", key_scale), ("value_scale", value_scale)):
        if s.dtype != torch.float32 or tuple(s.shape) != tuple(key_cache.shape[:3]) or not s.is_contiguous():
            raise OpError(
                f"{name}: {s.dtype} {tuple(s.shape)}, expected contiguous float32 {[kvh, *key_cache.shape[1:3]]}"
            )
    if key.shape != (T, kvh * d) or value.shape != (T, kvh * d) or slot_mapping.shape != (T,):
        raise OpError(
            f"write_kv_cache_int8: key {tuple(key.shape)}, value {tuple(value.shape)}: expected [T, {kvh * d}]"
        )
    if T == 0:
        return
    write_kv_cache_int8_kernel[(T, kvh)](
        key, value, key_cache, value_cache, key_scale, value_scale, slot_mapping,
        key.stride(0), value.stride(0), stride_cache_head, HEAD_SIZE=d, D_PAD=next_pow2(d),
    )  # fmt: skip


@PAGED_ATTENTION.implement(inputs=_DECODE_INPUTS, extra=(keyword("out", None), keyword("block_n", None)))
def paged_attention_decode(a: SimpleNamespace) -> Any:
    """Decode attention: ``query [S, H*D]`` (token s is sequence s's newest token, position
    ``context_lens[s]-1``, its K/V already in the head-major pool ``[KVH, NB, BS, D]``) ->
    ``out [S, H*D]`` in query's dtype. ``paged_attention_decode(query, key_cache, value_cache,
    block_tables, context_lens, *, <attributes>, out=None, block_n=None)``."""
    import torch

    tiles, scale = _attention_attrs(a)
    query, block_tables = a.query, a.block_tables
    stride_cache_head = _check_cache(a.key_cache, a.value_cache, a.block_size, a.num_kv_heads, a.head_size)
    S = block_tables.shape[0]
    if query.shape != (S, a.num_heads * a.head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [S, H*D] = [{S}, {a.num_heads * a.head_size}]")
    out = torch.empty_like(query) if a.out is None else a.out
    if S == 0:
        return out
    pool, strides, int8 = _pool_and_strides(a, out, stride_cache_head)
    paged_attention_decode_kernel[(S, a.num_kv_heads)](
        out,
        query,
        *pool,
        scale,
        int(a.sliding_window),
        *strides,
        **tiles,
        BLOCK_N=a.block_n or decode_block_n(tiles),
        KV_INT8=int8,
    )
    return out


def _prefill_block_q(tiles: dict[str, int], block_q: int | None, block_n: int) -> int:
    """``BLOCK_Q`` of the prefill kernel; ``block_q`` None: 64 rows per tile. Raises
    :class:`OpError` unless BLOCK_Q x GROUP_PAD >= 16 (``tl.dot``), block_n >= 16, both powers of two."""
    gp = tiles["GROUP_PAD"]
    bq = block_q or prefill_block_q(tiles)
    if bq * gp < 16 or block_n < 16 or bq & (bq - 1) or block_n & (block_n - 1):
        raise OpError(f"block_q={bq} x group {gp} must give >= 16 rows; block_n={block_n} >= 16; powers of two")
    return bq


@PAGED_ATTENTION.implement(
    inputs=(*_DECODE_INPUTS, "query_start_loc"),
    extra=(keyword("out", None), keyword("block_q", None), keyword("block_n", 32), keyword("input_precision", None)),
)
def paged_attention_prefill(a: SimpleNamespace) -> Any:
    """Prefill attention over packed ragged chunks (``query [T, H*D]``, ``query_start_loc
    [S+1]``), this step's K/V already in the head-major pool ``[KVH, NB, BS, D]``. ``out [T, H*D]``
    in query's dtype. ``paged_attention_prefill(query, key_cache, value_cache, block_tables,
    context_lens, query_start_loc, *, <attributes>, out=None, block_q=None, block_n=32,
    input_precision=None)``."""
    import torch

    tiles, scale = _attention_attrs(a)
    query, block_tables, qsl = a.query, a.block_tables, a.query_start_loc
    stride_cache_head = _check_cache(a.key_cache, a.value_cache, a.block_size, a.num_kv_heads, a.head_size)
    T, S = query.shape[0], block_tables.shape[0]
    if query.shape != (T, a.num_heads * a.head_size) or query.stride(1) != 1:
        raise OpError(f"query: shape {tuple(query.shape)}, expected [T, H*D] = [T, {a.num_heads * a.head_size}]")
    if qsl.shape != (S + 1,):
        raise OpError(f"query_start_loc: shape {tuple(qsl.shape)}, expected [S+1] = [{S + 1}]")
    out = torch.empty_like(query) if a.out is None else a.out
    if T == 0 or S == 0:
        return out
    bq = _prefill_block_q(tiles, a.block_q, a.block_n)
    pool, strides, int8 = _pool_and_strides(a, out, stride_cache_head)
    paged_attention_prefill_kernel[(T // bq + S, a.num_kv_heads)](
        out,
        query,
        *pool,
        qsl,
        S,
        scale,
        int(a.sliding_window),
        *strides,
        **tiles,
        BLOCK_Q=bq,
        BLOCK_N=a.block_n,
        INPUT_PRECISION=_precision(query.dtype, a.input_precision),
        KV_INT8=int8,
    )
    return out


@PAGED_ATTENTION.implement(extra=(keyword("max_query_len", None),))
def paged_attention(a: SimpleNamespace) -> tuple[Any, ...]:
    """``trtpipe::PagedAttention`` on torch tensors (caches head-major ``[KVH, NB, BS, D]``,
    contiguous; an int8 pool with its float32 scales ``[KVH, NB, BS]``): write K/V in place,
    then attention. The op's parameter list, plus ``max_query_len=None``.

    Returns ``(output, key_cache, value_cache)`` (int8: ``+ (key_scale, value_scale)``) with the
    caches being the (updated) inputs, the in-place aliasing backends use. ``max_query_len == 1`` (decode batch: one token per
    sequence, ``T == S``) selects the decode kernel; None reads it from query_start_loc (a host
    sync).
    """
    int8 = a.key_scale is not None
    if int8:
        write_kv_cache_int8(a.key, a.value, a.key_cache, a.value_cache, a.key_scale, a.value_scale, a.slot_mapping)
    else:
        write_kv_cache(a.key, a.value, a.key_cache, a.value_cache, a.slot_mapping)
    S = a.block_tables.shape[0]
    max_query_len = a.max_query_len
    if max_query_len is None:
        qsl = a.query_start_loc
        max_query_len = int((qsl[1:] - qsl[:-1]).max().item()) if S else 0
    attrs = {x.name: getattr(a, x.name) for x in PAGED_ATTENTION.arguments}
    pool = {n: getattr(a, n) for n in _DECODE_INPUTS}
    if max_query_len == 1 and a.query.shape[0] == S:
        out = paged_attention_decode(**pool, **attrs)
    else:
        out = paged_attention_prefill(**pool, query_start_loc=a.query_start_loc, **attrs)
    return (out, a.key_cache, a.value_cache) + ((a.key_scale, a.value_scale) if int8 else ())
