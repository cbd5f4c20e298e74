"""Packing of blockwise INT4 (and 8-bit) weights for ``trtpipe::Int4Gemm`` / ``com.microsoft::MatMulNBits``:
the one home of the nibble layout.

Pure NumPy. Three jobs:

1. Pack/unpack 4-bit codes and zero points in the MatMulNBits layout (the contract of
   ``trtpipe::Int4Gemm``), and the dequantization arithmetic on unpacked codes (defined in
   :mod:`trtpipe.plugins.ops.int4_gemm.layout`, re-exported here)::

       W [N, K]  --blocks of G along K-->  B [N, K/G, G/2] uint8
       byte i of a block = code[2i] | code[2i+1] << 4        (low nibble = even element)
       uint8 zero points [N, K/G] -> [N, ceil(K/G/2)]: block 2b low nibble, 2b+1 high nibble
       W[n, k] = (float32(q[n, k]) - zp[n, k // G]) * float32(scale[n, k // G])

2. Round-to-nearest (RTN) and least-squares symmetric blockwise quantization of float weights
   (:func:`quantize_rtn`, :func:`quantize_symmetric_mse`, :func:`requantize_symmetric`).

3. Repack GGUF/ggml blocks (decoded by :mod:`trtpipe.plugins.ops.int4_gemm.gguf_blocks`) without a float
   round trip.

:func:`trtpipe.plugins.ops.int4_gemm.reference.dequantize_int4` (the op's reference) checks its inputs and
uses this layout; the lowerings and kernels' host code import it from here.
Errors are :class:`~trtpipe.plugins.core.errors.OpError` with the field, value, expectation and fix.
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm import layout
from trtpipe.plugins.ops.int4_gemm.gguf_blocks import (
    GGUF_BLOCK,
    GGUF_BLOCK_BYTES,
    dequantize_gguf_q8_0,
    fp16_field,
    gguf_blocks,
    unpack_gguf_q4_codes,
)
from trtpipe.plugins.ops.int4_gemm.layout import (  # noqa: F401  (re-exported: the MatMulNBits layout)
    check_group_size,
    dequantize_codes,
    pack_int4,
    pack_zero_points_uint8,
    unpack_int4,
    unpack_int4_codes,
    unpack_zero_points_uint8,
    zero_points_float,
)

__all__ = [
    *layout.__all__,
    "quantize_rtn",
    "quantize_symmetric_mse",
    "requantize_symmetric",
    "GGUF_BLOCK",
    "GGUF_BLOCK_BYTES",
    "unpack_gguf_q4_codes",
    "repack_gguf_q4_0",
    "repack_gguf_q4_1",
    "repack_gguf_q4_1_exact",
    "dequantize_gguf_q8_0",
    "repack_gguf_q8_0_as_uint8",
]


# --------------------------------------------------------------------------------------------
# RTN quantization
# --------------------------------------------------------------------------------------------


def quantize_rtn(w: np.ndarray, group_size: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest blockwise 4-bit quantization of ``w [N, K]`` (float) along K.

    Conventions (chosen so that every element satisfies ``|w - deq| <= scale/2``, up to float
    rounding, with no clipping):

    - symmetric: ``scale = absmax/7``, implied zero point 8, ``q = round(w/scale) + 8`` in 1..15
      (code 0 is unused; ORT's quantizer uses ``scale = max/-8`` instead, one more level but up
      to a full ``scale`` of clipping error on the opposite side).
    - asymmetric (ORT ``MlasQuantizeBlockwise`` convention): the block range is widened to
      include 0, ``lo = min(min, 0)``, ``hi = max(max, 0)``, ``scale = (hi - lo)/15``,
      ``zp = clip(round(-lo/scale), 0, 15)``, ``q = clip(round(w/scale) + zp, 0, 15)``.

    An all-zero block gets scale 0 (and zp 8 / 0): it dequantizes to exactly 0.
    Rounding is NumPy's round-half-to-even.

    Returns:
        ``(packed [N, K/G, G/2] uint8, scales [N, K/G] float32, zero_points)`` where
        zero_points is None (symmetric) or packed uint8 ``[N, ceil(K/G/2)]``.

    Raises:
        OpError: w not 2-D float, K % G != 0 (names K, G and group sizes that divide K),
            G not a power of two >= 16, non-finite weights.
    """
    blocks = _weight_blocks(w, group_size)  # [N, K/G, G] float32
    N, nb, G = blocks.shape
    K = nb * G
    if symmetric:
        scales = (np.abs(blocks).max(axis=-1) / np.float32(7)).astype(np.float32)
        zp = np.full(scales.shape, 8, dtype=np.int32)
    else:
        lo = np.minimum(blocks.min(axis=-1), 0)
        hi = np.maximum(blocks.max(axis=-1), 0)
        scales = ((hi - lo) / np.float32(15)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scales > 0, -lo / scales, 0)
        zp = np.clip(np.round(zp_f), 0, 15).astype(np.int32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scales > 0, 1 / scales, 0).astype(np.float32)
    q = np.clip(np.round(blocks * inv[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    packed = pack_int4(q.reshape(N, K), G)
    zero_points = None if symmetric else pack_zero_points_uint8(zp.astype(np.uint8))
    return packed, scales, zero_points


def _weight_blocks(w: np.ndarray, group_size: int) -> np.ndarray:
    """``w [N, K]`` float -> ``[N, K/G, G]`` float32 blocks, after the checks every quantizer
    shares (2-D float, a valid group size, finite). Raises :class:`OpError`."""
    x = np.asarray(w)
    if x.ndim != 2 or x.dtype.kind != "f":
        raise OpError(f"w: shape {x.shape} dtype {x.dtype}, expected a 2-D float array [N, K]")
    N, K = x.shape
    check_group_size(K, group_size)
    if not np.all(np.isfinite(x)):
        raise OpError("w: contains NaN or Inf; cannot quantize")
    return x.astype(np.float32).reshape(N, K // int(group_size), int(group_size))


SYMMETRIC_SCALE_DIVISORS = tuple(np.linspace(6.0, 8.5, 11).tolist())  # scale = absmax / d candidates


def quantize_symmetric_mse(
    w: np.ndarray, group_size: int, *, scale_dtype=np.float16, divisors: tuple[float, ...] = SYMMETRIC_SCALE_DIVISORS
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blockwise 4-bit quantization of ``w [N, K]`` with the scale that minimizes each
    block's squared error: TensorRT's INT4 ``DequantizeLinear`` form (``w ~= c * scale``,
    c = code - 8 in [-8, 7], no zero point).

    For each block, ``scale = absmax / d`` for every ``d`` in ``divisors`` (6.0 .. 8.5: d = 7 is
    plain round-to-nearest with no clipping, d = 8 uses code -8 for a negative extreme, d > 8
    clips the extremes to shrink the step for the bulk), rounded to ``scale_dtype`` (fp16: the
    dtype TensorRT runs the scales in, so the codes are chosen for the scale it will use),
    ``c = clip(round(w / scale), -8, 7)``; the candidate with the smallest ``sum((w - c*scale)^2)``
    wins (ties: the first). Same search as llama.cpp's ``make_qx_quants`` in spirit (a grid over
    the scale, least squares), without its per-candidate refit. An all-zero block gets scale 1
    and codes 8 (exactly 0; TensorRT may refuse a zero scale).

    Returns ``(packed [N, K/G, G/2] uint8, MatMulNBits order with implied zero point 8,
    scales [N, K/G] float32, exactly representable in ``scale_dtype``)``.
    Raises :class:`OpError` like :func:`quantize_rtn`.
    """
    blocks = _weight_blocks(w, group_size)  # [N, K/G, G] float32
    N, nb, G = blocks.shape
    K = nb * G
    absmax = np.abs(blocks).max(axis=-1)  # [N, nb]
    best_err = np.full(absmax.shape, np.inf, np.float32)
    best_scale = np.ones(absmax.shape, np.float32)
    for d in divisors:
        s = (absmax / np.float32(d)).astype(scale_dtype).astype(np.float32)
        s = np.where(s > 0, s, np.float32(1))
        c = np.clip(np.round(blocks / s[..., None]), -8, 7)
        err = np.square(blocks - c * s[..., None]).sum(axis=-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, s, best_scale)
    codes = np.clip(np.round(blocks / best_scale[..., None]), -8, 7).astype(np.int16) + 8
    return pack_int4(codes.reshape(N, K).astype(np.uint8), G), best_scale.astype(np.float32)


def requantize_symmetric(
    b_packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, K: int, N: int, group_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric INT4 blocks (e.g. GGUF Q4_1 as float zero points) -> symmetric INT4 blocks of
    the same group size, re-quantized from the dequantized weights with
    :func:`quantize_symmetric_mse`. Not exact: each weight moves by up to about half a (new)
    code step; measure the model's agreement (docs/tensorrt.md).

    Returns ``(packed [N, K/G, G/2] uint8, scales [N, K/G] float32)``; zero point 8 implied.
    """
    import hashlib

    h = hashlib.sha1(f"{K},{N},{group_size}".encode())
    for a in (b_packed, scales, zero_points):
        if a is not None:
            a = np.ascontiguousarray(a)
            h.update(str(a.dtype).encode() + a.tobytes())
    key = h.hexdigest()
    hit = _REQUANT_MEMO.get(key)
    if hit is not None:  # the build re-quantizes the same weights for the lowering and for measuring
        return hit[0].copy(), hit[1].copy()
    G = int(group_size)
    w = dequantize_codes(unpack_int4_codes(b_packed, K, N, G), scales, zero_points_float(zero_points, N, K // G), G)
    packed, new_scales = quantize_symmetric_mse(w, group_size)
    size = packed.nbytes + new_scales.nbytes
    if sum(p.nbytes + s.nbytes for p, s in _REQUANT_MEMO.values()) + size <= _REQUANT_MEMO_MAX_BYTES:
        _REQUANT_MEMO[key] = (packed.copy(), new_scales.copy())
    return packed, new_scales


_REQUANT_MEMO: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_REQUANT_MEMO_MAX_BYTES = 512 << 20


# --------------------------------------------------------------------------------------------
# GGUF / ggml repacking (block decoding: gguf_blocks.py)
# --------------------------------------------------------------------------------------------


def _q4_codes_packed(blocks: np.ndarray, qs_offset: int) -> np.ndarray:
    N, nb, _ = blocks.shape
    codes = unpack_gguf_q4_codes(blocks[..., qs_offset : qs_offset + 16])  # [N, nb, 32]
    return pack_int4(codes.reshape(N, nb * GGUF_BLOCK), GGUF_BLOCK)


def repack_gguf_q4_0(raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repack a GGUF Q4_0 tensor for ``Int4Gemm`` / MatMulNBits (group size 32).

    Exact: ``(q - 8) * d`` in float32 is what ``gguf.quants.dequantize`` computes.

    Args:
        raw: uint8, ``N*K/32*18`` bytes (``GGUFReader`` ``tensor.data``, shape ``[N, K/32*18]``).
        N: rows (output features); K: row length (input features), a multiple of 32.

    Returns:
        ``(packed [N, K/32, 16] uint8, scales [N, K/32] float32 = d,
        zero_points [N, ceil(K/64)] uint8 packed, every nibble 8)``.
    """
    blocks = gguf_blocks(raw, N, K, "Q4_0")
    scales = fp16_field(blocks, 0)
    packed = _q4_codes_packed(blocks, 2)
    zp = pack_zero_points_uint8(np.full(scales.shape, 8, dtype=np.uint8))
    return packed, scales, zp


def repack_gguf_q4_1_exact(raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a GGUF Q4_1 tensor into ``(packed codes [N, K/32, 16], d [N, K/32], m [N, K/32])``.

    ``float32(q) * d + m`` (two float32 roundings, no FMA) reproduces ``gguf.quants.dequantize``
    bit for bit. d and m are the fp16 fields widened to float32.
    """
    blocks = gguf_blocks(raw, N, K, "Q4_1")
    return _q4_codes_packed(blocks, 4), fp16_field(blocks, 0), fp16_field(blocks, 2)


def repack_gguf_q4_1(raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repack a GGUF Q4_1 tensor for ``Int4Gemm`` with float zero points (``w = (q - zp)*scale``).

    ``scale = d``, ``zp = -m/d`` (float32), so ``(q - zp)*d = q*d + m`` up to float32 rounding
    (measured max error ~1e-7 of the block's magnitude, see tests). A block with ``d == 0`` is
    constant ``m``; ``zp`` would be infinite, so it becomes codes 0, ``scale = m``, ``zp = -1``:
    ``(0 - (-1)) * m = m`` exactly (m = 0 included).

    Returns:
        ``(packed [N, K/32, 16] uint8, scales [N, K/32] float32, zero_points [N, K/32] float32)``.
    """
    packed, d, m = repack_gguf_q4_1_exact(raw, N, K)
    degenerate = d == 0
    scales = np.where(degenerate, m, d).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zp = np.where(degenerate, np.float32(-1), -m / np.where(degenerate, 1, d)).astype(np.float32)
    if degenerate.any():
        mask = np.repeat(degenerate[..., None], GGUF_BLOCK // 2, axis=-1)
        packed = np.where(mask, np.uint8(0), packed)
    return packed, scales, zp


def repack_gguf_q8_0_as_uint8(raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Repack GGUF Q8_0 for an 8-bit MatMulNBits (bits=8, block_size=32, default zero point 128).

    Returns ``(codes [N, K/32, 32] uint8 = q + 128, scales [N, K/32] float32 = d)``;
    ``(codes - 128) * d`` is exact.
    """
    blocks = gguf_blocks(raw, N, K, "Q8_0")
    d = fp16_field(blocks, 0)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16)
    return (q + 128).astype(np.uint8), d
