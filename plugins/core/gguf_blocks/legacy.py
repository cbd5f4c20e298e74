"""Decoders of ggml's 32-weight block types into the kernel form (one group per block, G = 32).
Byte layouts from ggml-common.h; arithmetic from gguf-py ``quants.py`` (``dequantize_blocks``)::

    Q4_0 (18 B): fp16 d | qs[16]                     gguf: d * float32(q - 8)
    Q4_1 (20 B): fp16 d | fp16 m | qs[16]            gguf: (d * float32(q)) + m
    Q5_0 (22 B): fp16 d | qh u32 | qs[16]            gguf: d * float32(q - 16)
    Q5_1 (24 B): fp16 d | fp16 m | qh u32 | qs[16]   gguf: (d * float32(q)) + m
    Q8_0 (34 B): fp16 d | int8 q[32]                 gguf: float32(q) * d

4-bit low part of element j: ``qs[j] & 15`` for j < 16, ``qs[j - 16] >> 4`` after; Q5's fifth bit
of element j is bit j of the little-endian ``qh``. d and m are fp16 widened to float32 (exact).

Why exact: symmetric types become ``c = q - offset`` (int8), ``s = d``, ``o = -0.0``: the kernel's
``s * c`` is the same single float32 product as gguf's (multiplication commutes bit for bit) and
adding -0.0 changes nothing. Q4_1 / Q5_1 become ``c = q``, ``s = d``, ``o = m``: the same product,
then the same single float32 add.
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.gguf_blocks.kernel_form import block_view, fp16_field, low_high_nibbles

__all__ = ["decode_q4_0", "decode_q4_1", "decode_q5_0", "decode_q5_1", "decode_q8_0"]

Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes int8 [N, K], scales, offsets f32 [N, K/G]


def _rows(codes: np.ndarray) -> np.ndarray:
    """``[N, nb, 32]`` codes (any integer dtype, values fit int8) -> int8 ``[N, nb * 32]``."""
    return codes.astype(np.int8).reshape(codes.shape[0], -1)


def _no_offset(scales: np.ndarray) -> np.ndarray:
    return np.full(scales.shape, -0.0, np.float32)


def _q5_codes(blocks: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """Unsigned 5-bit codes ``[N, nb, 32]`` (int16) of Q5_0 / Q5_1 blocks."""
    low = low_high_nibbles(blocks[..., qs_at : qs_at + 16]).astype(np.int16)
    high = np.unpackbits(blocks[..., qh_at : qh_at + 4], axis=-1, bitorder="little").astype(np.int16)
    return low | (high << 4)


def decode_q4_0(raw: np.ndarray) -> Decoded:
    """Q4_0 rows -> codes ``q - 8`` in -8..7, scales d, offsets -0.0."""
    b = block_view(raw, "Q4_0")
    d = fp16_field(b, 0)
    q = low_high_nibbles(b[..., 2:18]).astype(np.int16) - 8
    return _rows(q), d, _no_offset(d)


def decode_q4_1(raw: np.ndarray) -> Decoded:
    """Q4_1 rows -> codes q in 0..15, scales d, offsets m."""
    b = block_view(raw, "Q4_1")
    return _rows(low_high_nibbles(b[..., 4:20])), fp16_field(b, 0), fp16_field(b, 2)


def decode_q5_0(raw: np.ndarray) -> Decoded:
    """Q5_0 rows -> codes ``q - 16`` in -16..15, scales d, offsets -0.0."""
    b = block_view(raw, "Q5_0")
    d = fp16_field(b, 0)
    return _rows(_q5_codes(b, 2, 6) - 16), d, _no_offset(d)


def decode_q5_1(raw: np.ndarray) -> Decoded:
    """Q5_1 rows -> codes q in 0..31, scales d, offsets m."""
    b = block_view(raw, "Q5_1")
    return _rows(_q5_codes(b, 4, 8)), fp16_field(b, 0), fp16_field(b, 2)


def decode_q8_0(raw: np.ndarray) -> Decoded:
    """Q8_0 rows -> codes q in -128..127 (the int8 bytes as stored), scales d, offsets -0.0."""
    b = block_view(raw, "Q8_0")
    d = fp16_field(b, 0)
    return _rows(np.ascontiguousarray(b[..., 2:34]).view(np.int8)), d, _no_offset(d)
