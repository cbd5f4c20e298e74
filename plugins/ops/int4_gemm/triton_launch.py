"""Launcher of ``trtpipe::Int4Gemm``'s Triton kernel (:mod:`trtpipe.plugins.ops.int4_gemm.triton_kernels`)
on torch tensors: checks shapes and attributes, picks the tiles and grid and launches on the
tensors' device (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``: the tests, against
:mod:`trtpipe.plugins.ops.int4_gemm.reference`). Its parameter list is the op's description's
(:data:`~trtpipe.plugins.ops.int4_gemm.spec.INT4_GEMM`) plus the tile sizes. The TensorRT plugin
launches an AOT-compiled wrapper kernel instead (:mod:`trtpipe.plugins.ops.int4_gemm.trt_plugin`).

Imports triton at module level and torch inside the launcher; build/bench side only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import triton

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm.layout import check_group_size
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.int4_gemm.triton_kernels import int4_gemm_kernel
from trtpipe.plugins.ops.numerics import dot_input_precision
from trtpipe.plugins.ops.spec import keyword

__all__ = ["int4_gemm"]

_TILES = (keyword("block_m", 16), keyword("block_n", 32), keyword("block_k", None), keyword("input_precision", None))


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


def _check_weights(x: SimpleNamespace) -> tuple[int, int]:
    """``(G, K/G)`` after checking bits, the group size and the shapes of A, B and scales."""
    import torch

    if x.bits != 4:
        raise OpError(f"attribute bits={x.bits}: Int4Gemm supports bits=4 only")
    K, N = x.K, x.N
    check_group_size(K, x.group_size)
    G, nb = int(x.group_size), K // int(x.group_size)
    if x.a.shape[-1] != K:
        raise OpError(f"A: shape {tuple(x.a.shape)}, expected [..., K] with K={K}")
    b = x.b_packed
    if tuple(b.shape) != (N, nb, G // 2) or b.dtype != torch.uint8 or not b.is_contiguous():
        raise OpError(f"b_packed: {tuple(b.shape)} {b.dtype}, expected contiguous uint8 [{N}, {nb}, {G // 2}]")
    if tuple(x.scales.shape) != (N, nb) or not x.scales.is_contiguous():
        raise OpError(f"scales: shape {tuple(x.scales.shape)}, expected contiguous [{N}, {nb}]")
    return G, nb


@INT4_GEMM.implement(extra=_TILES)
def int4_gemm(x: SimpleNamespace) -> Any:
    """``trtpipe::Int4Gemm`` on torch tensors: ``a [..., K]`` -> ``y [..., N]`` in a's dtype.
    ``int4_gemm(a, b_packed, scales, zero_points=None, *, K, N, group_size, bits=4, block_m=16,
    block_n=32, block_k=None, input_precision=None)``.

    ``b_packed [N, K/G, G/2]`` uint8, ``scales [N, K/G]``, ``zero_points`` None | uint8
    ``[N, ceil(K/G/2)]`` | float ``[N, K/G]`` (see :func:`trtpipe.plugins.ops.int4_gemm.reference.int4_gemm`).
    """
    import torch

    G, nb = _check_weights(x)
    K, N, a = x.K, x.N, x.a
    zp_mode, zp = _zero_point_mode(x.zero_points, x.scales, N, nb)
    bk = x.block_k or min(G, 64)
    if G % bk or bk < 16:
        raise OpError(f"block_k={bk} must be >= 16 and divide group_size={G}")
    a2 = a.reshape(-1, K)
    if a2.stride(1) != 1:
        a2 = a2.contiguous()
    M = a2.shape[0]
    y = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M:
        grid = (triton.cdiv(M, x.block_m), triton.cdiv(N, x.block_n))
        int4_gemm_kernel[grid](
            a2,
            x.b_packed,
            x.scales,
            zp,
            y,
            M,
            N,
            K,
            a2.stride(0),
            y.stride(0),
            GROUP=G,
            ZP_MODE=zp_mode,
            BLOCK_M=x.block_m,
            BLOCK_N=x.block_n,
            BLOCK_K=bk,
            INPUT_PRECISION=x.input_precision or dot_input_precision("fp32" if a.dtype == torch.float32 else "fp16"),
        )
    return y.reshape(*a.shape[:-1], N)
