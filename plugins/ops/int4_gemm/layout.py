"""The MatMulNBits nibble layout of blockwise INT4 weights (the contract of ``trtpipe::Int4Gemm``
and ``com.microsoft::MatMulNBits``) and the dequantization arithmetic on unpacked codes::

    W [N, K]  --blocks of G along K-->  B [N, K/G, G/2] uint8
    byte i of a block = code[2i] | code[2i+1] << 4        (low nibble = even element)
    uint8 zero points [N, K/G] -> [N, ceil(K/G/2)]: block 2b low nibble, 2b+1 high nibble
    W[n, k] = (float32(q[n, k]) - zp[n, k // G]) * float32(scale[n, k // G])

Pure NumPy. Re-exported by :mod:`trtpipe.plugins.ops.int4_gemm.pack` (quantization and GGUF repacking
onto this layout), from where the lowerings, kernels' host code and reference import it.
Errors are :class:`~trtpipe.plugins.core.errors.OpError` with the field, value, expectation and fix.
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.errors import OpError

__all__ = [
    "check_group_size",
    "pack_int4",
    "unpack_int4",
    "unpack_int4_codes",
    "pack_zero_points_uint8",
    "unpack_zero_points_uint8",
    "zero_points_float",
    "dequantize_codes",
]


def check_group_size(K: int, group_size: int) -> None:
    """Raise :class:`OpError` unless ``group_size`` is a power of two >= 16 dividing ``K`` (the
    message lists the group sizes that divide K)."""
    G = int(group_size)
    if G < 16 or G & (G - 1):
        raise OpError(f"group_size={group_size}: expected a power of two >= 16 (16, 32, 64, 128, ...)")
    if K % G != 0:
        divisors = [g for g in (16, 32, 64, 128, 256, 512, 1024) if K % g == 0]
        fix = (
            f"pick a group size that divides K: {divisors}"
            if divisors
            else "K has no power-of-two divisor >= 16; keep this layer unquantized"
        )
        raise OpError(f"K={K} is not a multiple of group_size={G}; {fix}")


def _nibbles(name: str, values: np.ndarray, layout: str) -> np.ndarray:
    """``values`` as a 2-D integer array of 4-bit values, or :class:`OpError` naming ``name``."""
    v = np.asarray(values)
    if v.ndim != 2:
        raise OpError(f"{name}: shape {v.shape}, expected {layout}")
    if v.dtype.kind not in "iu":
        raise OpError(f"{name}: dtype {v.dtype}, expected an integer dtype with values 0..15")
    if v.size and (v.min() < 0 or v.max() > 15):
        raise OpError(f"{name}: values in [{v.min()}, {v.max()}], expected 0..15 (4-bit)")
    return v


def _pack_pairs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``lo | hi << 4`` as uint8: the one place the MatMulNBits byte is assembled."""
    return (lo.astype(np.uint8) | (hi.astype(np.uint8) << 4)).astype(np.uint8)


def _unpack_pairs(packed: np.ndarray) -> np.ndarray:
    """uint8 ``[...]`` -> ``[..., 2]`` (low nibble, high nibble): the inverse of :func:`_pack_pairs`."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).astype(np.uint8)


def pack_int4(codes: np.ndarray, group_size: int) -> np.ndarray:
    """Pack codes ``[N, K]`` (integers 0..15) into ``[N, K/G, G/2]`` uint8, MatMulNBits order.

    Byte i of each block holds code 2i in the low nibble and code 2i+1 in the high nibble.

    Raises:
        OpError: not 2-D, codes outside 0..15, K % G != 0, G not a power of two >= 16.
    """
    c = _nibbles("codes", codes, "[N, K]")
    N, K = c.shape
    check_group_size(K, group_size)
    G = int(group_size)
    pairs = c.astype(np.uint8).reshape(N, K // G, G // 2, 2)
    return _pack_pairs(pairs[..., 0], pairs[..., 1])


def unpack_int4_codes(b_packed: np.ndarray, K: int, N: int, group_size: int) -> np.ndarray:
    """Unpack ``[N, K/G, G/2]`` uint8 (MatMulNBits order) to codes ``[N, K]`` uint8 in 0..15.

    Byte i of each block holds code 2i in the low nibble and code 2i+1 in the high nibble.
    Raises :class:`OpError` for a bad group size, dtype or shape.
    """
    check_group_size(K, group_size)
    G = int(group_size)
    b = np.asarray(b_packed)
    if b.dtype != np.uint8:
        raise OpError(f"b_packed: dtype {b.dtype}, expected uint8")
    if b.shape != (N, K // G, G // 2):
        raise OpError(f"b_packed: shape {tuple(b.shape)}, expected [N, K/G, G/2] = [{N}, {K // G}, {G // 2}]")
    return _unpack_pairs(b).reshape(N, K)


def unpack_int4(packed: np.ndarray, K: int, group_size: int) -> np.ndarray:
    """Inverse of :func:`pack_int4`: ``[N, K/G, G/2]`` uint8 -> codes ``[N, K]`` uint8 0..15."""
    p = np.asarray(packed)
    if p.ndim != 3:
        raise OpError(f"packed: shape {p.shape}, expected [N, K/G, G/2]")
    return unpack_int4_codes(p, int(K), p.shape[0], int(group_size))


def pack_zero_points_uint8(zero_points: np.ndarray) -> np.ndarray:
    """Pack zero points ``[N, K/G]`` (0..15) to ``[N, ceil(K/G/2)]`` uint8 (MatMulNBits).

    Block 2b is the low nibble and block 2b+1 the high nibble of byte b, per row n. With an odd
    number of blocks the unused high nibble of the last byte is 0 (never read).
    """
    z = _nibbles("zero_points", zero_points, "[N, K/G]")
    N, nb = z.shape
    padded = np.zeros((N, nb + (nb % 2)), dtype=np.uint8)
    padded[:, :nb] = z
    return _pack_pairs(padded[:, 0::2], padded[:, 1::2])


def unpack_zero_points_uint8(zp_packed: np.ndarray, N: int, num_blocks: int) -> np.ndarray:
    """Unpack uint8 zero points ``[N, ceil(num_blocks/2)]`` to ``[N, num_blocks]`` uint8 0..15.

    Same nibble order as the codes along the block axis (block 2i low, 2i+1 high), per row n.
    """
    zp = np.asarray(zp_packed)
    cols = (num_blocks + 1) // 2
    if zp.dtype != np.uint8 or zp.shape != (N, cols):
        raise OpError(
            f"zero_points: uint8 shape {zp.shape} dtype {zp.dtype}, expected packed uint8 "
            f"[N, ceil(K/G/2)] = [{N}, {cols}]"
        )
    return _unpack_pairs(zp).reshape(N, 2 * cols)[:, :num_blocks]


def zero_points_float(zero_points: np.ndarray | None, N: int, num_blocks: int) -> np.ndarray:
    """4-bit zero points in any stored form -> ``[N, num_blocks]`` float32: None -> 8
    (symmetric), packed uint8 ``[N, ceil(num_blocks/2)]`` -> unpacked, float ``[N, num_blocks]``
    (e.g. ``-m/d`` of GGUF Q4_1) -> as float32. Raises :class:`OpError` for another shape."""
    if zero_points is None:
        return np.full((N, num_blocks), 8.0, np.float32)
    z = np.asarray(zero_points)
    if z.dtype == np.uint8:
        return unpack_zero_points_uint8(z, N, num_blocks).astype(np.float32)
    if z.shape != (N, num_blocks):
        raise OpError(f"zero_points: shape {z.shape} dtype {z.dtype}, expected float [N, K/G] = [{N}, {num_blocks}]")
    return z.astype(np.float32)


def dequantize_codes(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, group_size: int) -> np.ndarray:
    """``W[n, k] = (float32(q[n, k]) - zp[n, b]) * float32(scale[n, b])`` with ``b = k // G``.

    codes ``[N, K]`` (unpacked, 4- or 8-bit); scales and zero points ``[N, K/G]`` (float).
    Returns ``W [N, K]`` float32 (the arithmetic of ``Int4Gemm``; shapes checked by callers).
    """
    N, K = codes.shape
    G = int(group_size)
    q = codes.reshape(N, K // G, G).astype(np.float32)
    zp = np.asarray(zero_points).astype(np.float32)
    return ((q - zp[:, :, None]) * np.asarray(scales).astype(np.float32)[:, :, None]).reshape(N, K)
