"""Triton kernel of ``trtpipe::Int4Gemm``, for the GPU backends (TensorRT plugin, AOT):
:func:`int4_gemm_kernel`, a fused dequantization W4A16 GEMM/GEMV with the
``com.microsoft::MatMulNBits`` packing: ``Y = A @ ((q - zp) * scale)^T``, zero points absent (8),
packed uint8 or float. Its launcher on torch tensors is
:func:`trtpipe.plugins.ops.int4_gemm.triton_launch.int4_gemm`, its AOT entry
:data:`trtpipe.plugins.triton.aot.AOT_KERNELS` ``["int4_gemm"]``.

Semantics are defined by :mod:`trtpipe.plugins.ops.int4_gemm.reference` (see ``docs/contracts.md``);
tests run the kernel under ``TRITON_INTERPRET=1`` against it. ``tl.dot`` runs on the input dtype
(fp16 -> tensor cores, fp32 accumulate); float32 inputs use ``input_precision="ieee"`` by default.

This module imports triton at module level (import it lazily), never torch. It is a plugin ABI
source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["int4_gemm_kernel"]


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
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=mmask[:, None] & nmask[None, :],
    )
