"""Plugin-side kernels of ``trtpipe::PagedAttention``'s TensorRT plugins (PagedKVWrite,
PagedAttention; :mod:`trtpipe.plugins.ops.paged_attention.trt_plugin`): the wrapper ``@triton.jit``
kernels in TensorRT's argument order (:mod:`trtpipe.plugins.ops.trt_kernel_abi`: inputs, extra
scalars, outputs; NB as an extra scalar) and their configurations per node attributes, dtype and
tactic. The AOT compilation is :mod:`trtpipe.plugins.ops.trt_kernels`'.

This module imports triton at module level (import it lazily, build side only). It is a plugin
ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

# no `from __future__ import annotations`: the wrapper kernels keep their annotations as objects, like the plugins
from typing import Any

import triton
import triton.language as tl

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.numerics import dot_input_precision
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION
from trtpipe.plugins.ops.paged_attention.tiles import attention_tiles, decode_block_n, next_pow2, prefill_block_q
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_kernel,
)
from trtpipe.plugins.ops.trt_kernel_abi import wrapper_signature

__all__ = [
    "PREFILL_TACTICS",
    "kv_write_config",
    "attention_config",
    "KV_WRITE_EXTRAS",
    "DECODE_EXTRAS",
    "PREFILL_EXTRAS",
]

# PagedAttention prefill tactics: BLOCK_N (keys per iteration)
PREFILL_TACTICS = {1: 32, 2: 64}
KV_WRITE, ATTENTION = PAGED_ATTENTION.plugin("PagedKVWrite"), PAGED_ATTENTION.plugin("PagedAttention")
# each wrapper's extra scalars (TensorRT passes them between inputs and outputs)
KV_WRITE_EXTRAS = ("num_blocks",)  # NB, key_cache [KVH, NB, BS, D] axis 1
DECODE_EXTRAS = ("max_blocks", "num_blocks")  # MB (block-table row stride), NB
PREFILL_EXTRAS = ("num_seqs", "max_blocks", "num_blocks")  # S, MB, NB


# ============================================================================================
# plugin-ABI wrapper kernels: (inputs..., extra scalars..., outputs...)
# ============================================================================================


@triton.jit
def kv_write_plugin_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,  # inputs
    num_blocks,  # extra: NB (key_cache [KVH, NB, BS, D] axis 1)
    key_cache_out_ptr,
    value_cache_out_ptr,  # outputs (same memory as key_cache / value_cache)
    KVH_D: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (T,). Rows of key/value are contiguous ([T, KVH*D]); caches head-major [KVH, NB, BS, D]."""
    stride_cache_head = num_blocks.to(tl.int64) * (BLOCK_SIZE * HEAD_SIZE)
    write_kv_cache_kernel(
        key_ptr,
        value_ptr,
        key_cache_out_ptr,
        value_cache_out_ptr,
        slot_mapping_ptr,
        KVH_D,
        KVH_D,
        stride_cache_head,
        KVH_D,
        HEAD_SIZE,
        BLOCK,
    )


@triton.jit
def attention_decode_plugin_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,  # inputs
    max_blocks,  # extras: MB (block-table row stride),
    num_blocks,  # NB (key_cache [KVH, NB, BS, D] axis 1)
    output_ptr,  # output
    SCALE: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Grid (S, KVH). One token per sequence (query row s = sequence s); query_start_loc unused."""
    HD: tl.constexpr = NUM_KV_HEADS * GROUP * HEAD_SIZE
    window = tl.full((), WINDOW, tl.int32)
    scale = tl.full((), SCALE, tl.float32)
    stride_cache_head = num_blocks.to(tl.int64) * (BLOCK_SIZE * HEAD_SIZE)
    paged_attention_decode_kernel(
        output_ptr,
        query_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_cache_ptr,  # key_scale_ptr / value_scale_ptr: float pools (KV_INT8 False), never read
        value_cache_ptr,
        block_tables_ptr,
        context_lens_ptr,
        scale,
        window,
        HD,
        HD,
        max_blocks,
        stride_cache_head,
        NUM_KV_HEADS,
        HEAD_SIZE,
        BLOCK_SIZE,
        GROUP,
        GROUP_PAD,
        D_PAD,
        BLOCK_N,
        False,  # KV_INT8
    )


@triton.jit
def attention_prefill_plugin_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,  # inputs
    num_seqs,
    max_blocks,
    num_blocks,  # extras: S, MB, NB (key_cache [KVH, NB, BS, D] axis 1)
    output_ptr,  # output
    SCALE: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Grid (T // BLOCK_Q + S, KVH): ragged packed chunks (see paged_attention_prefill_kernel)."""
    HD: tl.constexpr = NUM_KV_HEADS * GROUP * HEAD_SIZE
    window = tl.full((), WINDOW, tl.int32)
    scale = tl.full((), SCALE, tl.float32)
    stride_cache_head = num_blocks.to(tl.int64) * (BLOCK_SIZE * HEAD_SIZE)
    paged_attention_prefill_kernel(
        output_ptr,
        query_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_cache_ptr,  # key_scale_ptr / value_scale_ptr: float pools (KV_INT8 False), never read
        value_cache_ptr,
        block_tables_ptr,
        context_lens_ptr,
        query_start_loc_ptr,
        num_seqs,
        scale,
        window,
        HD,
        HD,
        max_blocks,
        stride_cache_head,
        NUM_KV_HEADS,
        HEAD_SIZE,
        BLOCK_SIZE,
        GROUP,
        GROUP_PAD,
        D_PAD,
        BLOCK_Q,
        BLOCK_N,
        INPUT_PRECISION,
        False,  # KV_INT8
    )


# ============================================================================================
# kernel configurations (pure functions: tested on CPU)
# ============================================================================================


def _attention_constexprs(
    num_heads: int, num_kv_heads: int, head_size: int, scale: float, block_size: int, sliding_window: int
) -> dict[str, Any]:
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise OpError(
            f"PagedAttention: num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}"
        )
    return dict(
        SCALE=float(scale) or 1.0 / float(head_size) ** 0.5,
        WINDOW=int(sliding_window),
        **attention_tiles(num_heads, num_kv_heads, head_size, block_size),
    )


def kv_write_config(attrs: dict[str, Any], f: str) -> tuple[Any, dict, dict, int]:
    """PagedKVWrite's ``(wrapper kernel, signature, constexprs, num_warps)`` (``f``: the Triton
    float pointer type; see :func:`trtpipe.plugins.ops.trt_kernels.kernel_config`)."""
    head_size = int(attrs["head_size"])
    kvh_d = int(attrs["num_kv_heads"]) * head_size
    c = {"KVH_D": kvh_d, "HEAD_SIZE": head_size, "BLOCK_SIZE": int(attrs["block_size"]), "BLOCK": next_pow2(kvh_d)}
    sig = wrapper_signature(PAGED_ATTENTION, KV_WRITE, f, KV_WRITE_EXTRAS, c)
    return kv_write_plugin_kernel, sig, c, 4


def attention_config(attrs: dict[str, Any], dtype: str, f: str, tactic: int) -> tuple[Any, dict, dict, int]:
    """PagedAttention's ``(wrapper kernel, signature, constexprs, num_warps)``: the decode wrapper
    for ``decode=1``, else prefill (see :func:`trtpipe.plugins.ops.trt_kernels.kernel_config`)."""
    c = _attention_constexprs(
        int(attrs["num_heads"]),
        int(attrs["num_kv_heads"]),
        int(attrs["head_size"]),
        float(attrs.get("scale", 0.0)),
        int(attrs["block_size"]),
        int(attrs.get("sliding_window", 0)),
    )
    if int(attrs.get("decode", 0)):
        c["BLOCK_N"] = decode_block_n(c)
        return attention_decode_plugin_kernel, wrapper_signature(PAGED_ATTENTION, ATTENTION, f, DECODE_EXTRAS, c), c, 4
    c["BLOCK_Q"] = prefill_block_q(c)
    c["BLOCK_N"] = PREFILL_TACTICS.get(tactic, 32)
    c["INPUT_PRECISION"] = dot_input_precision(dtype)
    sig = wrapper_signature(PAGED_ATTENTION, ATTENTION, f, PREFILL_EXTRAS, c)
    return attention_prefill_plugin_kernel, sig, c, 4
