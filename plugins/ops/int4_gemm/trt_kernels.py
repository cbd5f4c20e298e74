"""Plugin-side kernel of ``trtpipe::Int4Gemm``'s TensorRT plugin
(:mod:`trtpipe.plugins.ops.int4_gemm.trt_plugin`): the wrapper ``@triton.jit`` kernel in
TensorRT's argument order (float zero points: ZP_MODE 2) and its configuration per node
attributes, dtype and tactic (:data:`INT4_TACTICS`). The kernel ABI is
:mod:`trtpipe.plugins.ops.trt_kernel_abi`'s, the AOT compilation :mod:`trtpipe.plugins.ops.trt_kernels`'.

This module imports triton at module level (import it lazily, build side only). It is a plugin
ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

# no `from __future__ import annotations`: the wrapper kernels keep their annotations as objects, like the plugins
from typing import Any

import triton
import triton.language as tl

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.int4_gemm.triton_kernels import int4_gemm_kernel
from trtpipe.plugins.ops.numerics import dot_input_precision
from trtpipe.plugins.ops.trt_kernel_abi import wrapper_signature

__all__ = ["INT4_TACTICS", "int4_gemm_config", "EXTRAS"]

# Int4Gemm tactics: (BLOCK_M, BLOCK_N, BLOCK_K cap, num_warps). 1-2 are GEMV-shaped (decode, M <= 16).
INT4_TACTICS = {1: (16, 32, 64, 4), 2: (16, 64, 64, 4), 3: (64, 64, 32, 4), 4: (128, 64, 32, 8)}
PLUGIN = INT4_GEMM.plugin("Int4Gemm")
EXTRAS = ("M",)  # the wrapper's extra scalar: rows of A (product of its leading dims)


@triton.jit
def int4_gemm_plugin_kernel(
    a_ptr,
    b_packed_ptr,
    scales_ptr,
    zero_points_ptr,  # inputs (float zero points)
    M,  # extra: rows of A (product of its leading dims)
    Y_ptr,  # output
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
        a_ptr,
        b_packed_ptr,
        scales_ptr,
        zero_points_ptr,
        Y_ptr,
        M,
        N,
        K,
        K,
        N,
        GROUP,
        2,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        INPUT_PRECISION,
    )


def int4_gemm_config(attrs: dict[str, Any], dtype: str, f: str, tactic: int) -> tuple[Any, dict, dict, int]:
    """Int4Gemm's ``(wrapper kernel, signature, constexprs, num_warps)``: tile and warps from
    :data:`INT4_TACTICS` (tactic 1 if unknown; see :func:`trtpipe.plugins.ops.trt_kernels.kernel_config`)."""
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
        "INPUT_PRECISION": dot_input_precision(dtype),
    }
    return int4_gemm_plugin_kernel, wrapper_signature(INT4_GEMM, PLUGIN, f, EXTRAS, c), c, warps
