"""Decoders of ggml's 256-weight "k-quant" super-blocks into the kernel form. Byte layouts from
ggml-common.h; arithmetic from gguf-py ``quants.py`` (``Q4_K`` / ``Q5_K`` / ``Q6_K``)::

    Q4_K (144 B): fp16 d | fp16 dmin | scales[12] | qs[128]              8 sub-blocks of 32
    Q5_K (176 B): fp16 d | fp16 dmin | scales[12] | qh[32] | qs[128]     8 sub-blocks of 32
    Q6_K (210 B): ql[128] | qh[64] | int8 sc[16] | fp16 d                16 sub-blocks of 16

    Q4_K / Q5_K, sub-block j:  gguf: (fl32(d * sc_j) * float32(q)) - fl32(dmin * m_j)
    Q6_K, sub-block j:         gguf:  fl32(d * sc_j) * float32(q - 32)

Q4_K / Q5_K's 6-bit ``sc_j`` and ``m_j`` (``get_scale_min``): j < 4 in the low 6 bits of bytes j
and 4 + j; j >= 4 split: low 4 bits in byte 8 + (j - 4) (sc: low nibble, m: high nibble), top 2
bits in the top 2 bits of byte j - 4 (sc) or j (m). Codes: Q4_K sub-block 2i + h is nibble h of
``qs[32 i : 32 i + 32]``; Q5_K adds bit j of ``qh[e]`` as bit 4 of element e of sub-block j;
Q6_K element ``128 h + 64 n + b`` takes nibble n of ``ql[64 h + b]``, element ``128 h + 32 s + b``
takes bits ``2 s, 2 s + 1`` of ``qh[32 h + b]`` as bits 4-5.

Why exact: the kernel form stores ``s = fl32(d * sc_j)`` computed here exactly as gguf computes it
(one float32 product of the widened fp16 and the integer), so the kernel's ``fl32(s * c)`` is
gguf's second product. Q4_K / Q5_K store ``o = -fl32(dmin * m_j)``: negation is exact and IEEE
defines ``a - b`` as ``a + (-b)``, zeros included. Q6_K stores ``c = q - 32`` and ``o = -0.0``.
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.gguf_blocks.kernel_form import block_view, fp16_field

__all__ = ["decode_q4_k", "decode_q5_k", "decode_q6_k", "k_scale_min"]

Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes int8 [N, K], scales, offsets f32 [N, K/G]


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 scale bytes ``[..., 12]`` -> (sc, m) uint8 ``[..., 8]`` in 0..63."""
    s = scales.astype(np.uint8)
    lo_sc, lo_m, split = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo_sc & 0x3F, (split & 0x0F) | ((lo_sc >> 2) & 0x30)], axis=-1)
    m = np.concatenate([lo_m & 0x3F, (split >> 4) | ((lo_m >> 2) & 0x30)], axis=-1)
    return sc, m


def _k_low_codes(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K ``qs [N, nb, 128]`` -> low 4 bits ``[N, nb, 8, 32]`` (sub-block 2i + h: nibble h
    of bytes 32i..32i+31)."""
    q = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([q & 0x0F, q >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales ``fl32(d * sc_j)`` and offsets ``-fl32(dmin * m_j)``, float32 ``[N, nb * 8]``."""
    d, dmin = fp16_field(b, 0), fp16_field(b, 2)
    sc, m = k_scale_min(b[..., 4:16])
    scales = d[..., None] * sc.astype(np.float32)
    offsets = -(dmin[..., None] * m.astype(np.float32))
    N = b.shape[0]
    return scales.reshape(N, -1), offsets.reshape(N, -1)


def decode_q4_k(raw: np.ndarray) -> Decoded:
    """Q4_K rows -> codes q in 0..15 (G = 32), scales ``d * sc_j``, offsets ``-(dmin * m_j)``."""
    b = block_view(raw, "Q4_K")
    codes = _k_low_codes(b[..., 16:144])
    scales, offsets = _k_scales(b)
    return codes.astype(np.int8).reshape(b.shape[0], -1), scales, offsets


def decode_q5_k(raw: np.ndarray) -> Decoded:
    """Q5_K rows -> codes q in 0..31 (G = 32), scales ``d * sc_j``, offsets ``-(dmin * m_j)``."""
    b = block_view(raw, "Q5_K")
    low = _k_low_codes(b[..., 48:176])  # [N, nb, 8, 32]
    bits = np.unpackbits(b[..., 16:48, None], axis=-1, bitorder="little")  # [N, nb, 32 (e), 8 (j)]
    high = np.swapaxes(bits, -1, -2)  # [N, nb, 8 (j), 32 (e)]
    codes = low | (high << 4)
    scales, offsets = _k_scales(b)
    return codes.astype(np.int8).reshape(b.shape[0], -1), scales, offsets


def decode_q6_k(raw: np.ndarray) -> Decoded:
    """Q6_K rows -> codes ``q - 32`` in -32..31 (G = 16), scales ``d * sc_j``, offsets -0.0."""
    b = block_view(raw, "Q6_K")
    N, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(N, nb, 2, 1, 64)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2).reshape(N, nb, 256)  # [h, n, b]
    qh = b[..., 128:192].reshape(N, nb, 2, 1, 32)
    high = ((qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 0x03).reshape(N, nb, 256)  # [h, s, b]
    codes = (low | (high << 4)).astype(np.int16) - 32
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)  # [N, nb, 16]
    scales = (fp16_field(b, 208)[..., None] * sc).reshape(N, -1)
    return codes.astype(np.int8).reshape(N, -1), scales, np.full(scales.shape, -0.0, np.float32)
