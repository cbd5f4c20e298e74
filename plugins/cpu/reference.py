"""NumPy references of the host CPU kernels' arithmetic (``csrc/tp.h``), for tests.

:func:`quantize_activations` is the activation quantizer written out (round half to even, as
``lrintf``; clipped to +-127; or, in the int16 form of ``levels: 2``, one int16 level clipped to
+-32767); :func:`gemm_from_quantized` the GEMM's integer dot products and
fp32 block scaling in float64 (what the kernels compute, up to fp32 rounding of the sums);
:func:`gemm_i8_from_quantized` the same for I8 weights from GGUF's kernel form (per-G dots).
The float GEMM the kernels approximate is ``x @ dequantize(W).T`` (:func:`.layout.dequantize`).
"""

from __future__ import annotations

import numpy as np

from trtpipe.plugins.core.gguf_blocks import KernelBlocks
from trtpipe.plugins.cpu.layout import GROUP, NEG_ZERO_BITS


def quantize_activations(x: np.ndarray, levels: int, form: str = "int8x2") -> dict[str, np.ndarray]:
    """``x [M, K]`` float32 -> ``q1, q2`` int8 ``[M, K]``, ``s1, s2, asum`` float32 ``[M, K/32]``
    (``q2``, ``s2`` zero for one level). ``form`` "int16" with ``levels`` 2: :func:`quantize_int16`."""
    if form == "int16" and levels == 2:
        return quantize_int16(x)
    M, K = x.shape
    xb = x.astype(np.float32).reshape(M, K // GROUP, GROUP)
    s1 = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    inv1 = np.where(s1 > 0, np.float32(1) / np.where(s1 > 0, s1, 1), 0).astype(np.float32)
    q1 = np.clip(np.rint(xb * inv1[..., None]), -127, 127).astype(np.int8)
    r = (xb - q1.astype(np.float32) * s1[..., None]).astype(np.float32)
    s2 = (np.abs(r).max(axis=2) / np.float32(127)).astype(np.float32)
    inv2 = np.where(s2 > 0, np.float32(1) / np.where(s2 > 0, s2, 1), 0).astype(np.float32)
    q2 = np.clip(np.rint(r * inv2[..., None]), -127, 127).astype(np.int8)
    if levels == 1:
        q2, s2 = np.zeros_like(q2), np.zeros_like(s2)
    return {
        "q1": q1.reshape(M, K),
        "q2": q2.reshape(M, K),
        "s1": s1,
        "s2": s2,
        "asum": xb.sum(axis=2, dtype=np.float32),
        # per-16 code sums (tp_quant_act_halves): [M, K/16]
        "qhalf1": q1.reshape(M, K // 16, 16).sum(axis=2, dtype=np.int32),
        "qhalf2": q2.reshape(M, K // 16, 16).sum(axis=2, dtype=np.int32),
    }


def quantize_int16(x: np.ndarray) -> dict[str, np.ndarray]:
    """The int16 form (tp.h): ``x [M, K]`` float32 -> ``q1`` int16 ``[M, K]`` (k order),
    ``s1 = max|x| / 32767`` and ``asum`` float32 ``[M, K/32]``, ``q2``, ``s2`` zero: one level,
    so :func:`gemm_from_quantized` and :func:`gemm_i8_from_quantized` take it as they are."""
    M, K = x.shape
    xb = x.astype(np.float32).reshape(M, K // GROUP, GROUP)
    s1 = (np.abs(xb).max(axis=2) / np.float32(32767)).astype(np.float32)
    inv = np.where(s1 > 0, np.float32(1) / np.where(s1 > 0, s1, 1), 0).astype(np.float32)
    q1 = np.clip(np.rint(xb * inv[..., None]), -32767, 32767).astype(np.int16)
    return {
        "q1": q1.reshape(M, K),
        "q2": np.zeros((M, K), np.int16),
        "s1": s1,
        "s2": np.zeros_like(s1),
        "asum": xb.sum(axis=2, dtype=np.float32),
        "qhalf1": q1.reshape(M, K // 16, 16).sum(axis=2, dtype=np.int32),
        "qhalf2": np.zeros((M, K // 16), np.int32),
    }


def gemm_from_quantized(a: dict[str, np.ndarray], codes: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """``y [M, N]`` float64 from quantized activations ``a`` and weights in blockwise form:
    ``codes [N, K]`` (Q4: 0..15 with minimums ``m``; Q8: ``u`` 0..255, ``m`` None), ``d``
    (and ``m``) ``[N, K/32]``."""
    M, K = a["q1"].shape
    nb = K // GROUP
    w = codes.astype(np.int64) - (0 if m is not None else 128)  # [N, K]
    y = np.zeros((M, codes.shape[0]))
    for q, s in (("q1", "s1"), ("q2", "s2")):
        dots = np.einsum("mbk,nbk->mnb", a[q].astype(np.int64).reshape(M, nb, GROUP), w.reshape(-1, nb, GROUP))
        y += np.einsum("mnb,mb,nb->mn", dots.astype(np.float64), a[s].astype(np.float64), d.astype(np.float64))
    if m is not None:
        y += a["asum"].astype(np.float64) @ m.astype(np.float64).T
    return y


def gemm_i8_from_quantized(a: dict[str, np.ndarray], kb: KernelBlocks) -> np.ndarray:
    """``y [M, N]`` float64 from quantized activations ``a`` and an I8 weight in GGUF's kernel
    form ``kb`` (codes int8 ``[N, K]``, scales / offsets ``[N, K/G]``): per group of G the integer
    dots ``sum c q`` times the activation block's scale and the group's scale, plus (offsets not
    all -0.0, G = 32 only) ``offset * asum`` per 32-block."""
    M, K = a["q1"].shape
    G, ng = kb.group_size, K // kb.group_size
    c = kb.codes.astype(np.int64).reshape(-1, ng, G)
    y = np.zeros((M, kb.N))
    for q, s in (("q1", "s1"), ("q2", "s2")):
        dots = np.einsum("mgk,ngk->mng", a[q].astype(np.int64).reshape(M, ng, G), c).astype(np.float64)
        act_scale = np.repeat(a[s].astype(np.float64), GROUP // G, axis=1)  # [M, K/G]: its 32-block's
        y += np.einsum("mng,mg,ng->mn", dots, act_scale, kb.scales.astype(np.float64))
    if np.any(kb.offsets.view(np.uint32) != NEG_ZERO_BITS):
        y += a["asum"].astype(np.float64) @ kb.offsets.astype(np.float64).T
    return y
