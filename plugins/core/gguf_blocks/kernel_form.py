"""The kernel form of GGUF weights: int8 codes, a float32 scale and a float32 offset per group of
G weights along K, and its float32 dequantization (the arithmetic the C kernels follow).

    codes   int8    [N, K]      c[n, k]
    scales  float32 [N, K/G]    s[n, k // G]
    offsets float32 [N, K/G]    o[n, k // G]
    w[n, k] = fl32( fl32(s * float32(c)) + o )     two float32 roundings, never fused

Symmetric types store ``o = -0.0``: ``x + (-0.0) == x`` for every float32 x (+0.0 and -0.0
included), so the add is exact and a kernel may skip it (or fuse it: FMA with -0.0 gives the same
bits). An offset type (Q4_1, Q5_1, Q4_K, Q5_K) must not fuse the add (an FMA rounds once, gguf-py
twice). Every product and sum is an integer multiple of 2^-24 (fp16 scales times small integers),
so no float32 subnormal ever arises: flush-to-zero / denormals-are-zero modes do not change a bit.

Scales must stay float32 in a kernel layout: for Q4_K / Q5_K / Q6_K ``s = d * sc`` has up to 17
(Q6_K: 19) significant bits and can exceed 65504, so fp16 would round it (the legacy types' d and
m are fp16 fields, exact in fp16). For integer dot products, ``sum_k w x = s * sum_k c x + o *
sum_k x`` per group (codes fit int8 for every type); that sum is not the bit-exact value, only the
per-weight dequantization is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks.formats import GGUF_BLOCK_TYPES

__all__ = ["KernelBlocks", "dequantize_kernel_form", "block_view", "fp16_field", "low_high_nibbles"]


@dataclass(frozen=True)
class KernelBlocks:
    """One GGUF tensor in the kernel form (see the module docstring for the formula).

    ``qtype``: the GGUF type it came from (a key of ``GGUF_BLOCK_TYPES``); ``group_size`` G (16
    or 32); ``codes`` int8 ``[N, K]`` in ``code_min..code_max`` of the type; ``scales`` and
    ``offsets`` float32 ``[N, K/G]`` (offsets -0.0 for symmetric types)."""

    qtype: str
    group_size: int
    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray

    @property
    def N(self) -> int:
        return int(self.codes.shape[0])

    @property
    def K(self) -> int:
        return int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the form as held here (codes + scales + offsets)."""
        return self.codes.nbytes + self.scales.nbytes + self.offsets.nbytes


def dequantize_kernel_form(kb: KernelBlocks) -> np.ndarray:
    """``W [N, K]`` float32 = ``(s * c) + o`` in float32, group by group: the kernels' arithmetic,
    equal bit for bit to ``gguf.quants.dequantize`` of the blocks ``kb`` was decoded from."""
    G = kb.group_size
    c = kb.codes.astype(np.float32).reshape(kb.N, kb.K // G, G)
    prod = kb.scales[..., None] * c  # one float32 rounding (numpy never fuses ufuncs)
    return (prod + kb.offsets[..., None]).reshape(kb.N, kb.K)


def block_view(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Raw GGUF rows ``uint8 [N, row_bytes]`` (``WeightTensor.data``) as ``[N, K/B, block_bytes]``.
    Raises :class:`OpError` for another dtype or rank, or a row that is not whole blocks."""
    t = GGUF_BLOCK_TYPES[qtype]
    r = np.asarray(raw)
    if r.dtype != np.uint8 or r.ndim != 2:
        raise OpError(
            f"raw: {r.dtype} {r.shape}, expected uint8 [rows, row_bytes] (WeightTensor.data of a {qtype} "
            "tensor). Fix: pass the GGUF tensor's bytes with one row per output feature."
        )
    if r.shape[1] % t.block_bytes:
        raise OpError(
            f"raw: row_bytes = {r.shape[1]} is not a multiple of {qtype}'s block of {t.block_bytes} bytes. "
            "Fix: check the tensor's type and that rows were not split."
        )
    return np.ascontiguousarray(r).reshape(r.shape[0], r.shape[1] // t.block_bytes, t.block_bytes)


def fp16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Little-endian fp16 at byte ``offset`` of each block ``[N, nb, bytes]`` -> float32 ``[N, nb]``
    (exact widening)."""
    b = np.ascontiguousarray(blocks[..., offset : offset + 2])
    return b.view("<f2")[..., 0].astype(np.float32)


def low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit order: ``qs [..., n]`` -> ``[..., 2n]`` uint8, low nibbles first, then high
    (element j < n is ``qs[j] & 15``, element n + j is ``qs[j] >> 4``)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)
