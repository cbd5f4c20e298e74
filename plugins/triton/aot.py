"""Ahead-of-time compilation of the Triton kernels (:mod:`trtpipe.plugins.ops.paged_attention.triton_kernels`) to
cubin/PTX for a given SM without a GPU: :data:`AOT_KERNELS` (name -> kernel, signature, default
constexprs) and :func:`aot_compile`. Tests compile every kernel for sm_80 / sm_87 / sm_90 with it.
The paged-attention kernels take the head-major KV pool ``[KVH, NB, BS, D]`` and its head
stride ``stride_cache_head = NB * BS * D`` as an ``i64`` runtime argument (pools need not fit
in 2**31 elements; NB is not a compile-time constant).

This module imports triton at module level (import it lazily), never torch.
"""

from __future__ import annotations

from typing import Any

import triton

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    int4_gemm_kernel,
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_kernel,
)

__all__ = ["AOT_KERNELS", "aot_compile"]


_F = {"fp16": "*fp16", "fp32": "*fp32"}

# name -> (kernel, signature builder (dtype -> {arg: type}), default constexprs)
AOT_KERNELS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "write_kv_cache": (
        write_kv_cache_kernel,
        lambda dt: {
            "key_ptr": _F[dt],
            "value_ptr": _F[dt],
            "key_cache_ptr": _F[dt],
            "value_cache_ptr": _F[dt],
            "slot_mapping_ptr": "*i64",
            "stride_key_t": "i64",
            "stride_value_t": "i64",
            "stride_cache_head": "i64",
            "KVH_D": "constexpr",
            "HEAD_SIZE": "constexpr",
            "BLOCK": "constexpr",
        },
        {"KVH_D": 3 * 64, "HEAD_SIZE": 64, "BLOCK": 256},
    ),
    "paged_attention_decode": (
        paged_attention_decode_kernel,
        lambda dt: {
            "out_ptr": _F[dt],
            "query_ptr": _F[dt],
            "key_cache_ptr": _F[dt],
            "value_cache_ptr": _F[dt],
            "block_tables_ptr": "*i64",
            "context_lens_ptr": "*i64",
            "scale": "fp32",
            "sliding_window": "i32",
            "stride_q": "i64",
            "stride_out": "i64",
            "stride_bt": "i64",
            "stride_cache_head": "i64",
            **{
                k: "constexpr"
                for k in ("NUM_KV_HEADS", "HEAD_SIZE", "BLOCK_SIZE", "GROUP", "GROUP_PAD", "D_PAD", "BLOCK_N")
            },
        },
        {"NUM_KV_HEADS": 3, "HEAD_SIZE": 64, "BLOCK_SIZE": 16, "GROUP": 3, "GROUP_PAD": 4, "D_PAD": 64, "BLOCK_N": 32},
    ),
    "paged_attention_prefill": (
        paged_attention_prefill_kernel,
        lambda dt: {
            "out_ptr": _F[dt],
            "query_ptr": _F[dt],
            "key_cache_ptr": _F[dt],
            "value_cache_ptr": _F[dt],
            "block_tables_ptr": "*i64",
            "context_lens_ptr": "*i64",
            "query_start_loc_ptr": "*i64",
            "num_seqs": "i32",
            "scale": "fp32",
            "sliding_window": "i32",
            "stride_q": "i64",
            "stride_out": "i64",
            "stride_bt": "i64",
            "stride_cache_head": "i64",
            **{
                k: "constexpr"
                for k in (
                    "NUM_KV_HEADS",
                    "HEAD_SIZE",
                    "BLOCK_SIZE",
                    "GROUP",
                    "GROUP_PAD",
                    "D_PAD",
                    "BLOCK_Q",
                    "BLOCK_N",
                    "INPUT_PRECISION",
                )
            },
        },
        {
            "NUM_KV_HEADS": 3,
            "HEAD_SIZE": 64,
            "BLOCK_SIZE": 16,
            "GROUP": 3,
            "GROUP_PAD": 4,
            "D_PAD": 64,
            "BLOCK_Q": 16,
            "BLOCK_N": 32,
            "INPUT_PRECISION": "tf32",
        },
    ),
    "int4_gemm": (
        int4_gemm_kernel,
        lambda dt: {
            "a_ptr": _F[dt],
            "b_ptr": "*u8",
            "scales_ptr": _F[dt],
            "zp_ptr": "*u8",
            "y_ptr": _F[dt],
            "M": "i32",
            "N": "i32",
            "K": "i32",
            "stride_am": "i64",
            "stride_ym": "i64",
            **{k: "constexpr" for k in ("GROUP", "ZP_MODE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "INPUT_PRECISION")},
        },
        {"GROUP": 32, "ZP_MODE": 1, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "INPUT_PRECISION": "tf32"},
    ),
}


def aot_compile(
    name: str, *, cc: int, dtype: str = "fp16", num_warps: int = 4, fp_fusion: bool = True, **constexprs: Any
) -> Any:
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
