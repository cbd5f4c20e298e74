"""Plugin-side kernels of the TensorRT plugins (:mod:`trtpipe.plugins.ops.trt_plugins`): the wrapper
``@triton.jit`` kernels in TensorRT's argument order, their configurations per node attributes,
dtype and tactic, and their ahead-of-time compilation to PTX (no GPU needed).

Kernel ABI. TensorRT launches an AOT kernel with ``(inputs..., extra scalar args..., outputs...)``.
The kernels in :mod:`trtpipe.plugins.ops.paged_attention.triton_kernels` take outputs first and runtime strides, so
each plugin has a small wrapper ``@triton.jit`` kernel in that order that calls the shared
kernel body with strides fixed at compile time (contiguous tensors). The KV pools are head-major
``[KVH, NB, BS, D]``: NB varies with the pool a runtime sizes, so the KV plugins take it as an
extra scalar (``num_blocks``, from ``key_cache``'s axis 1) and widen ``num_blocks * BS * D`` to
int64 in the kernel (the head stride). Triton >= 3.3 appends two
hidden pointer parameters (global and profile scratch); they are unused when the kernel needs
no scratch (checked), and :func:`strip_unused_params` removes them from the PTX entry so the
parameter list is exactly what TensorRT passes.

This module imports triton at module level (import it lazily, build side only). It is a plugin
ABI source (:data:`trtpipe.plugins.core.versions.PLUGIN_ABI_SOURCES`).
"""

# no `from __future__ import annotations`: the wrapper kernels keep their annotations as objects, like the plugins
from typing import Any

import triton
import triton.language as tl

from trtpipe.plugins.core.dtypes import FLOAT_NAMES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.lowering.trt import PLUGIN_ATTRIBUTES
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    int4_gemm_kernel,
    next_pow2,
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_kernel,
)

__all__ = ["INT4_TACTICS", "PREFILL_TACTICS", "kernel_config", "strip_unused_params", "compile_plugin_kernel"]

# Int4Gemm tactics: (BLOCK_M, BLOCK_N, BLOCK_K cap, num_warps). 1-2 are GEMV-shaped (decode, M <= 16).
INT4_TACTICS = {1: (16, 32, 64, 4), 2: (16, 64, 64, 4), 3: (64, 64, 32, 4), 4: (128, 64, 32, 8)}
# PagedAttention prefill tactics: BLOCK_N (keys per iteration)
PREFILL_TACTICS = {1: 32, 2: 64}


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
    out_ptr,  # output
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
        out_ptr,
        query_ptr,
        key_cache_ptr,
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
    out_ptr,  # output
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
        out_ptr,
        query_ptr,
        key_cache_ptr,
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
    )


@triton.jit
def int4_gemm_plugin_kernel(
    a_ptr,
    b_ptr,
    scales_ptr,
    zp_ptr,  # inputs (float zero points)
    M,  # extra: rows of A (product of its leading dims)
    y_ptr,  # output
    N: tl.constexpr,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); A [M, K] and Y [M, N] contiguous."""
    int4_gemm_kernel(
        a_ptr, b_ptr, scales_ptr, zp_ptr, y_ptr, M, N, K, K, N, GROUP, 2, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION
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
    group = num_heads // num_kv_heads
    return dict(
        SCALE=float(scale) or 1.0 / float(head_size) ** 0.5,
        WINDOW=int(sliding_window),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=next_pow2(group),
        D_PAD=max(16, next_pow2(head_size)),
    )


def kernel_config(plugin: str, attrs: dict[str, Any], dtype: str, tactic: int = 1) -> tuple[Any, dict, dict, int]:
    """``(wrapper kernel, signature, constexprs, num_warps)`` of ``plugin`` for node attributes
    ``attrs``, float dtype ("fp16" | "fp32") and tactic. Raises :class:`OpError` on bad values."""
    f = f"*{dtype}" if dtype in FLOAT_NAMES else None  # Triton pointer types spell dtypes as recipes do
    if f is None:
        raise OpError(f"dtype {dtype!r}: the plugins run fp16, bf16 or fp32")
    if plugin == "PagedKVWrite":
        return _kv_write_config(attrs, f)
    if plugin == "PagedAttention":
        return _attention_config(attrs, dtype, f, tactic)
    if plugin == "Int4Gemm":
        return _int4_gemm_config(attrs, dtype, f, tactic)
    raise OpError(f"unknown plugin {plugin!r}; expected one of {sorted(PLUGIN_ATTRIBUTES)}")


def _kv_write_config(attrs: dict[str, Any], f: str) -> tuple[Any, dict, dict, int]:
    """PagedKVWrite's :func:`kernel_config` (``f``: the Triton float pointer type)."""
    head_size = int(attrs["head_size"])
    kvh_d = int(attrs["num_kv_heads"]) * head_size
    c = {"KVH_D": kvh_d, "HEAD_SIZE": head_size, "BLOCK_SIZE": int(attrs["block_size"]), "BLOCK": next_pow2(kvh_d)}
    sig = {
        "key_ptr": f,
        "value_ptr": f,
        "key_cache_ptr": f,
        "value_cache_ptr": f,
        "slot_mapping_ptr": "*i64",
        "num_blocks": "i32",
        "key_cache_out_ptr": f,
        "value_cache_out_ptr": f,
        **{k: "constexpr" for k in c},
    }
    return kv_write_plugin_kernel, sig, c, 4


def _attention_config(attrs: dict[str, Any], dtype: str, f: str, tactic: int) -> tuple[Any, dict, dict, int]:
    """PagedAttention's :func:`kernel_config`: the decode wrapper for ``decode=1``, else prefill."""
    c = _attention_constexprs(
        int(attrs["num_heads"]),
        int(attrs["num_kv_heads"]),
        int(attrs["head_size"]),
        float(attrs.get("scale", 0.0)),
        int(attrs["block_size"]),
        int(attrs.get("sliding_window", 0)),
    )
    ins = {
        "query_ptr": f,
        "key_cache_ptr": f,
        "value_cache_ptr": f,
        "block_tables_ptr": "*i64",
        "context_lens_ptr": "*i64",
        "query_start_loc_ptr": "*i64",
    }
    if int(attrs.get("decode", 0)):
        c["BLOCK_N"] = max(16, min(64, next_pow2(max(1, 8192 // (c["GROUP_PAD"] * c["D_PAD"])))))
        sig = {**ins, "max_blocks": "i32", "num_blocks": "i32", "out_ptr": f, **{k: "constexpr" for k in c}}
        return attention_decode_plugin_kernel, sig, c, 4
    c["BLOCK_Q"] = max(1, 64 // c["GROUP_PAD"])
    c["BLOCK_N"] = PREFILL_TACTICS.get(tactic, 32)
    c["INPUT_PRECISION"] = "ieee" if dtype == "fp32" else "tf32"
    sig = {**ins, "num_seqs": "i32", "max_blocks": "i32", "num_blocks": "i32", "out_ptr": f}
    sig.update({k: "constexpr" for k in c})
    return attention_prefill_plugin_kernel, sig, c, 4


def _int4_gemm_config(attrs: dict[str, Any], dtype: str, f: str, tactic: int) -> tuple[Any, dict, dict, int]:
    """Int4Gemm's :func:`kernel_config`: tile and warps from :data:`INT4_TACTICS` (tactic 1 if unknown)."""
    K, N, G = int(attrs["K"]), int(attrs["N"]), int(attrs["group_size"])
    if int(attrs.get("bits", 4)) != 4:
        raise OpError(f"Int4Gemm: bits={attrs.get('bits')}, only 4 is supported")
    if K % G or G < 16 or G & (G - 1):
        raise OpError(f"Int4Gemm: group_size={G} must be a power of two >= 16 dividing K={K}")
    bm, bn, bk, warps = INT4_TACTICS.get(tactic, INT4_TACTICS[1])
    c = {
        "N": N,
        "K": K,
        "GROUP": G,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": min(G, bk),
        "INPUT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
    }
    sig = {
        "a_ptr": f,
        "b_ptr": "*u8",
        "scales_ptr": f,
        "zp_ptr": f,
        "M": "i32",
        "y_ptr": f,
        **{k: "constexpr" for k in c},
    }
    return int4_gemm_plugin_kernel, sig, c, warps


def strip_unused_params(ptx: str, kernel_name: str, keep: int) -> str:
    """Remove the PTX entry parameters of ``kernel_name`` from index ``keep`` on (Triton's hidden
    scratch pointers), after checking the body never reads them. Raises :class:`OpError` if one
    is used (the kernel then needs scratch memory TensorRT does not provide)."""
    head_start = ptx.index(f".entry {kernel_name}(")
    head_end = ptx.index(")", head_start)
    params = [p.strip() for p in ptx[head_start + len(f".entry {kernel_name}(") : head_end].split(",") if p.strip()]
    if len(params) <= keep:
        return ptx
    body = ptx[head_end:]
    for i in range(keep, len(params)):
        if f"[{kernel_name}_param_{i}]" in body:
            raise OpError(
                f"kernel {kernel_name} reads hidden parameter {i} (Triton scratch memory); the TensorRT "
                "AOT launch does not pass it"
            )
    new_head = ",\n\t".join(params[:keep])
    return ptx[:head_start] + f".entry {kernel_name}(\n\t{new_head}\n" + ptx[head_end:]


def compile_plugin_kernel(
    plugin: str, attrs: dict[str, Any], dtype: str, *, cc: int, tactic: int = 1
) -> tuple[str, str, Any]:
    """Compile the plugin's wrapper kernel for ``sm_<cc>`` (no GPU needed) and return
    ``(kernel name, PTX with exactly the TensorRT-launched parameters, triton CompiledKernel)``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, sig, consts, warps = kernel_config(plugin, attrs, dtype, tactic)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", int(cc), 32), options={"num_warps": warps})
    m = k.metadata
    if getattr(m, "global_scratch_size", 0) or getattr(m, "profile_scratch_size", 0):
        raise OpError(f"{plugin}: the Triton kernel needs scratch memory, which TensorRT AOT plugins do not provide")
    n_args = sum(1 for v in sig.values() if v != "constexpr")
    return m.name, strip_unused_params(k.asm["ptx"], m.name, n_args), k
