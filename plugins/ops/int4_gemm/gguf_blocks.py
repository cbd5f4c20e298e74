"""GGUF / ggml quantized blocks as ``gguf.GGUFReader`` exposes them, decoded without a float
round trip (pure NumPy). Repacking into the ``Int4Gemm`` / MatMulNBits layout is
:mod:`trtpipe.plugins.ops.int4_gemm.pack`'s job; this module only reads ggml's bytes.

``tensor.data`` is uint8 ``[N, K/32 * block_bytes]``, one row per output feature. ggml block
layouts (``ggml-common.h``, block of 32 elements)::

    Q4_0  (18 B): fp16 d | 16 B qs            w = d * (q - 8)
    Q4_1  (20 B): fp16 d | fp16 m | 16 B qs   w = d * q + m
    Q8_0  (34 B): fp16 d | 32 x int8 qs       w = d * q
    4-bit element j of a block: j < 16 -> qs[j] & 0xF ; j >= 16 -> qs[j - 16] >> 4

ggml's nibble order (first half of the block in the low nibbles) differs from MatMulNBits
(neighbouring pairs), so repacking reorders codes, never re-quantizes them.
Errors are :class:`~trtpipe.plugins.core.errors.OpError` naming the value, the expectation and the fix.
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks import GGUF_BLOCK_TYPES

__all__ = [
    "GGUF_BLOCK",
    "GGUF_BLOCK_BYTES",
    "gguf_blocks",
    "fp16_field",
    "unpack_gguf_q4_codes",
    "dequantize_gguf_q8_0",
]

GGUF_BLOCK = 32  # elements per ggml Q4_0 / Q4_1 / Q8_0 block
GGUF_BLOCK_BYTES = {t: GGUF_BLOCK_TYPES[t].block_bytes for t in ("Q4_0", "Q4_1", "Q8_0")}  # 18, 20, 34


def gguf_blocks(raw: np.ndarray, N: int, K: int, kind: str) -> np.ndarray:
    """View raw GGUF bytes as ``[N, K/32, block_bytes]`` after checking sizes."""
    N, K = int(N), int(K)
    if K % GGUF_BLOCK:
        raise OpError(f"K={K}: GGUF {kind} rows must be a multiple of {GGUF_BLOCK} elements")
    r = np.asarray(raw)
    if r.dtype != np.uint8:
        raise OpError(f"raw: dtype {r.dtype}, expected the uint8 bytes of GGUFReader tensor.data")
    nbytes = GGUF_BLOCK_BYTES[kind]
    expected = N * (K // GGUF_BLOCK) * nbytes
    if r.size != expected:
        raise OpError(
            f"raw: {r.size} bytes (shape {r.shape}), expected N*K/32*{nbytes} = {expected} for a "
            f"{kind} tensor with N={N}, K={K}; check N (rows, out features) and K (row length)"
        )
    return np.ascontiguousarray(r).reshape(N, K // GGUF_BLOCK, nbytes)


def fp16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """fp16 little-endian field at ``offset`` of each block -> float32 ``[N, K/32]``."""
    b = np.ascontiguousarray(blocks[..., offset : offset + 2])
    return b.view("<f2")[..., 0].astype(np.float32)


def unpack_gguf_q4_codes(qs: np.ndarray) -> np.ndarray:
    """ggml 4-bit ``qs [..., 16]`` -> codes ``[..., 32]`` uint8 (j<16: low nibbles; j>=16: high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)


def dequantize_gguf_q8_0(raw: np.ndarray, N: int, K: int) -> np.ndarray:
    """Dequantize a GGUF Q8_0 tensor to float32 ``[N, K]`` (``q * d``, bit-exact with gguf)."""
    blocks = gguf_blocks(raw, N, K, "Q8_0")
    d = fp16_field(blocks, 0)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.float32)
    return (q * d[..., None]).reshape(int(N), int(K))
