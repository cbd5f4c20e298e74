"""NumPy reference that DEFINES ``trtpipe::Int4Gemm`` (domain "trtpipe", v1): :func:`int4_gemm`
and the weight dequantization it is built on, :func:`dequantize_int4` (weight-only INT4,
blockwise along K, the ``com.microsoft::MatMulNBits`` packing; bits=8 for LM heads).

The parameter list of :func:`int4_gemm` is the op's description's
(:data:`~trtpipe.plugins.ops.int4_gemm.spec.INT4_GEMM`, bound by
:meth:`~trtpipe.plugins.ops.spec.OpSpec.implement`). Imports only NumPy (the error family, input
checks and the INT4 layout of :mod:`trtpipe.plugins.ops.int4_gemm.layout`): safe on the embedded
runtime.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from trtpipe.plugins.core.checks import FLOAT_DTYPES, as_float_array, shape_error
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm.layout import (
    check_group_size,
    dequantize_codes,
    unpack_int4_codes,
    zero_points_float,
)
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM

__all__ = ["dequantize_int4", "int4_gemm"]


def dequantize_int4(
    b_packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    K: int,
    N: int,
    group_size: int,
    bits: int = 4,
) -> np.ndarray:
    """Dequantize ``trtpipe::Int4Gemm`` weights: ``W[n, k] = (q[n, k] - zp[n, b]) * scale[n, b]``.

    Args:
        b_packed: ``[N, K/G, G/2]`` uint8 codes (``com.microsoft::MatMulNBits`` packing).
        scales: ``[N, K/G]`` float32|float16.
        zero_points: None (8, symmetric), float ``[N, K/G]`` (same dtype as scales; any real
            value, e.g. ``-min/scale`` for GGUF Q4_1) or packed uint8 ``[N, ceil(K/G/2)]``.
        K, N, group_size: attributes; G a power of two >= 16 dividing K.

    ``bits=8`` (used for an 8-bit LM head, e.g. GGUF Q8_0): codes are unpacked bytes
    ``[N, K/G, G]`` uint8, the default zero point is 128 and uint8 zero points are unpacked
    ``[N, K/G]`` (``com.microsoft::MatMulNBits`` bits=8 layout).

    Returns:
        ``W [N, K]`` float32, computed in float32 as ``(float32(q) - float32(zp)) * float32(scale)``
        (the layout and arithmetic live in :mod:`trtpipe.plugins.ops.int4_gemm.layout`).

    Raises:
        OpError: K % G != 0 (names K and G and the group sizes that divide K), bad shapes/dtypes,
        bits not 4 or 8.
    """
    K, N = int(K), int(N)
    check_group_size(K, group_size)
    G = int(group_size)
    nb = K // G
    if int(bits) == 8:
        b = np.asarray(b_packed)
        if b.dtype != np.uint8 or b.shape != (N, nb, G):
            raise shape_error("b_packed", b.shape, f"uint8 [N, K/G, G] = [{N}, {nb}, {G}] for bits=8")
        zp8 = np.full((N, nb), 128.0, np.float32) if zero_points is None else np.asarray(zero_points).reshape(N, nb)
        return dequantize_codes(b.reshape(N, K), scales, zp8, G)
    if int(bits) != 4:
        raise OpError(f"attribute bits={bits}: trtpipe::Int4Gemm supports bits=4 (and 8 for LM heads)")
    codes = unpack_int4_codes(b_packed, K, N, G)
    s = np.asarray(scales)
    if s.dtype not in FLOAT_DTYPES:
        raise OpError(f"scales: dtype {s.dtype}, expected float32 or float16")
    if s.shape != (N, nb):
        raise shape_error("scales", s.shape, f"[N, K/G] = [{N}, {nb}]")
    z = None if zero_points is None else np.asarray(zero_points)
    if z is not None and z.dtype != np.uint8:
        if z.dtype not in FLOAT_DTYPES:
            raise OpError(f"zero_points: dtype {z.dtype}, expected uint8 (packed) or the scales dtype")
        if z.dtype != s.dtype:
            raise OpError(f"zero_points: dtype {z.dtype}, expected the scales dtype {s.dtype}")
    return dequantize_codes(codes, s, zero_points_float(z, N, nb), G)


@INT4_GEMM.implement()
def int4_gemm(x: SimpleNamespace) -> np.ndarray:
    """Reference of ``trtpipe::Int4Gemm``: ``Y[..., N] = A[..., K] @ W^T`` (float32 accumulate).

    ``int4_gemm(a, b_packed, scales, zero_points=None, *, K, N, group_size, bits=4)``.
    Same semantics as ``com.microsoft::MatMulNBits`` (bits=4, block_size=G, no g_idx, no bias).
    ``W`` comes from :func:`dequantize_int4`. ``A`` is float32|float16; ``Y`` has A's dtype.

    Raises:
        OpError: bits != 4, A's last dim != K, K % G != 0, or any input shape/dtype mismatch.
    """
    if int(x.bits) not in (4, 8):
        raise OpError(f"attribute bits={x.bits}: trtpipe::Int4Gemm supports bits=4 (and 8 for LM heads)")
    a = as_float_array("A", x.a)
    if a.ndim < 1 or a.shape[-1] != int(x.K):
        raise shape_error("A", a.shape, f"[..., K] with K={x.K}")
    w = dequantize_int4(x.b_packed, x.scales, x.zero_points, x.K, x.N, x.group_size, x.bits)
    y = a.astype(np.float32) @ w.T
    return y.astype(a.dtype)
