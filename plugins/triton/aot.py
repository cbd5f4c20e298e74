"""Ahead-of-time compilation of the ops' Triton kernels (``ops/<op>/triton_kernels.py``) to
cubin/PTX for a given SM without a GPU: :data:`AOT_KERNELS` (name -> kernel, default
constexprs; the signature is read from the kernel's own parameters, :func:`kernel_signature`)
and :func:`aot_compile`. Tests compile every kernel for sm_80 / sm_87 / sm_90 with it.
The paged-attention kernels take the head-major KV pool ``[KVH, NB, BS, D]`` and its head
stride ``stride_cache_head = NB * BS * D`` as an ``i64`` runtime argument (pools need not fit
in 2**31 elements; NB is not a compile-time constant).

This module imports triton at module level (import it lazily), never torch.
"""

from __future__ import annotations

from typing import Any

import triton

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm.triton_kernels import int4_gemm_kernel
from trtpipe.plugins.ops.paged_attention.triton_kernels import (
    paged_attention_decode_kernel,
    paged_attention_prefill_kernel,
    write_kv_cache_kernel,
)

__all__ = ["AOT_KERNELS", "aot_compile", "kernel_signature"]


_F = {"fp16": "*fp16", "fp32": "*fp32"}
# runtime arguments that are not float pointers, i64 strides or i32 scalars (everything else is)
_ARG_TYPES = {
    "slot_mapping_ptr": "*i64",
    "block_tables_ptr": "*i64",
    "context_lens_ptr": "*i64",
    "query_start_loc_ptr": "*i64",
    "b_ptr": "*u8",
    "zp_ptr": "*u8",  # ZP_MODE 2: the float dtype (aot_compile)
    "scale": "fp32",
    "key_scale_ptr": "*fp32",  # an int8 pool's scales (the float pools' AOT entries never read them)
    "value_scale_ptr": "*fp32",
}


def kernel_signature(kernel: Any, dtype: str) -> dict[str, str]:
    """Triton signature ``{argument: type}`` of ``kernel``, read from its own parameter list:
    constexprs, then by name: ``*_ptr`` float pointers of ``dtype`` (index tensors ``*i64``, codes
    ``*u8``: :data:`_ARG_TYPES`), ``stride_*`` i64, other scalars i32."""

    def kind(name: str) -> str:
        if name in _ARG_TYPES:
            return _ARG_TYPES[name]
        if name.endswith("_ptr"):
            return _F[dtype]
        return "i64" if name.startswith("stride_") else "i32"

    return {p.name: "constexpr" if p.is_constexpr else kind(p.name) for p in kernel.params}


# name -> (kernel, default constexprs: the SmolLM2 shapes, 3 kv heads, head 64, page 16)
AOT_KERNELS: dict[str, tuple[Any, dict[str, Any]]] = {
    "write_kv_cache": (write_kv_cache_kernel, {"KVH_D": 3 * 64, "HEAD_SIZE": 64, "BLOCK": 256}),
    "paged_attention_decode": (
        paged_attention_decode_kernel,
        {
            "NUM_KV_HEADS": 3,
            "HEAD_SIZE": 64,
            "BLOCK_SIZE": 16,
            "GROUP": 3,
            "GROUP_PAD": 4,
            "D_PAD": 64,
            "BLOCK_N": 32,
            "KV_INT8": False,
        },
    ),
    "paged_attention_prefill": (
        paged_attention_prefill_kernel,
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
            "KV_INT8": False,
        },
    ),
    "int4_gemm": (
        int4_gemm_kernel,
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
    fn, defaults = AOT_KERNELS[name]
    sig = kernel_signature(fn, dtype)
    consts = {**defaults, **constexprs}
    if name == "int4_gemm" and consts["ZP_MODE"] == 2:
        sig["zp_ptr"] = _F[dtype]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    options = {"num_warps": num_warps, "enable_fp_fusion": fp_fusion}
    return triton.compile(src, target=GPUTarget("cuda", int(cc), 32), options=options)
