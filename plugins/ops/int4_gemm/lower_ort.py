"""``trtpipe::Int4Gemm`` for ONNX Runtime's CPU EP: ``com.microsoft::MatMulNBits`` (same packing;
TOOLCHAIN.md), with an ``accuracy_level`` chosen by the caller (4 = int8 activations: faster,
~5e-3 relative error). Float zero points (GGUF Q4_1) and 8-bit blocks with fp32 activations get
exact rewrites around the fast symmetric kernel (:func:`lower_int4_gemm`). The graph walk that
calls this is :func:`trtpipe.plugins.lowering.ort.lower_for_ort`.
"""

from __future__ import annotations

import numpy as np
import onnx

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, InitializerView, NodeBuilder, node_attributes
from trtpipe.plugins.ops.int4_gemm.layout import check_group_size, pack_int4, pack_zero_points_uint8, unpack_int4_codes

__all__ = ["MS_DOMAIN", "FLOAT_ZERO_POINT_MODES", "lower_int4_gemm", "requantize_float_zp_to_uint8_8bit"]

MS_DOMAIN = "com.microsoft"
FLOAT_ZERO_POINT_MODES = ("exact", "int8")


def lower_int4_gemm(
    node: onnx.NodeProto,
    state: GraphRewrite,
    *,
    inits: InitializerView,
    accuracy_level: int = 0,
    float_zero_points: str = "exact",
) -> None:
    """Rewrite one ``Int4Gemm`` node into ``com.microsoft::MatMulNBits`` (+ a correction term)
    appended to ``state``; ``accuracy_level`` is MatMulNBits' (0 = fp32 activations, 4 = int8).

    uint8 (or absent) zero points map 1:1. Float zero points (GGUF Q4_1: ``w = d*q + m`` with
    ``zp = -m/d``) make MatMulNBits ~30x slower on CPU (measured: 2.5 ms vs 0.08 ms for a
    576x1536 GEMV), so they are lowered exactly as
    ``Y = MatMulNBits(A, q, d) + blocksum(A) @ M^T`` with ``M = (c - zp) * d`` [N, K/G],
    ``c = 2^(bits-1)`` the zero point MatMulNBits assumes without a zero-point input (its
    symmetric kernel: a 576x3072 GEMV at M = 1 takes ~0.7x the time of the explicit-zero-point
    one on a Zen 3, bench/host_peaks.py's shape), and
    ``blocksum(A)[.., g] = sum of A over group g`` (shared by linears reading the same A).
    That correction is ~20 % of a SmolLM2 decode step (removing it, timing only: 10.7 -> 8.6 ms
    after a 16-token prompt, 13.8 -> 11.7 ms after 512; docs/benchmarks.md), so with
    ``float_zero_points="int8"`` the blocks are instead re-coded as 8-bit blocks with integer zero
    points (:func:`requantize_float_zp_to_uint8_8bit`: each weight moves by at most ``d/32``, no
    correction term, twice the weight bytes).
    """
    b = NodeBuilder(node.name or node.op_type)
    _lower(b, node, inits, state.memo, accuracy_level, float_zero_points)
    state.emit(b)


def _lower(
    b: NodeBuilder,
    node: onnx.NodeProto,
    inits: InitializerView,
    memo: dict,
    accuracy_level: int,
    float_zero_points: str,
) -> None:
    """:func:`lower_int4_gemm`'s choice of form; ``memo``: the graph's shared state (block sums)."""
    a = node_attributes(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    nbits = dict(K=K, N=N, bits=a.get("bits", 4), block_size=G, accuracy_level=accuracy_level)
    inputs = list(node.input)
    zp_name = inputs[3] if len(inputs) > 3 else ""
    zp = inits.get(zp_name) if zp_name else None
    if nbits["bits"] == 8 and accuracy_level < 4:
        _lower_8bit_fp32_activations(b, inputs, list(node.output), zp, inits, nbits, memo)
        return
    if zp is None or zp.dtype == np.uint8:
        if zp is not None and nbits["bits"] == 4 and np.all(zp == 0x88):  # every packed zero point is 8
            inputs = inputs[:3]  # the implicit zero point: the faster symmetric kernel, same values
        b.op("MatMulNBits", inputs, "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output), **nbits)
        return
    bits = a.get("bits", 4)
    zf = zp.astype(np.float32)
    if np.all(zf == np.round(zf)) and zf.min() >= 0 and zf.max() <= (15 if bits == 4 else 255):
        # integer zero points (Q4_0, RTN, Q8_0): the fast uint8 form, exactly; all at the
        # implicit 2^(bits-1) (Q4_0, Q8_0): no zero-point input, the faster symmetric kernel
        if np.all(zf == 2 ** (bits - 1)):
            b.op("MatMulNBits", inputs[:3], "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output), **nbits)
            return
        z8 = zf.astype(np.uint8)
        if bits == 4:
            z8 = pack_zero_points_uint8(z8)  # [N, ceil(K/G/2)]
        zname = b.const(z8, np.uint8, hint="zero_points_u8")
        b.op("MatMulNBits", inputs[:3] + [zname], "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output), **nbits)
        return
    scales = inits[inputs[2]]
    if float_zero_points == "int8" and bits == 4:
        q8, d8, z8 = requantize_float_zp_to_uint8_8bit(unpack_int4_codes(inits[inputs[1]], K, N, G), scales, zp, G)
        names = [
            b.const(q8, np.uint8, hint="b_int8"),
            b.const(d8, np.float32, hint="scales_int8"),
            b.const(z8, np.uint8, hint="zero_points_int8"),
        ]
        b.op(
            "MatMulNBits",
            [inputs[0]] + names,
            "matmul_nbits",
            domain=MS_DOMAIN,
            outputs=list(node.output),
            **dict(nbits, bits=8),
        )
        return
    _lower_float_zero_points_exact(b, inputs, list(node.output), zp, scales, nbits, memo)


def _lower_float_zero_points_exact(
    b: NodeBuilder, inputs: list[str], outputs: list[str], zp: np.ndarray, scales: np.ndarray, nbits: dict, memo: dict
) -> None:
    """The exact form of blocks with float zero points (see :func:`lower_int4_gemm`):
    ``w = d*(q - zp) = d*(q - c) + d*(c - zp)``, ``c`` = MatMulNBits' implicit zero point
    (``2^(bits-1)``). MatMulNBits without a zero-point input runs the symmetric kernel, which ONNX
    Runtime's CPU GEMV runs faster than the one with explicit zero points; the offset
    ``d*(c - zp)`` per block goes into the correction term ``blocksum(A) @ offsets``."""
    K, G = nbits["K"], nbits["block_size"]
    c = float(2 ** (nbits["bits"] - 1))
    mins_t = np.ascontiguousarray(((c - zp.astype(np.float32)) * scales.astype(np.float32)).T)  # [K/G, N]
    mins = b.const(mins_t, np.float32, hint="mins_t")
    y = b.op("MatMulNBits", inputs[:3], "matmul_nbits", domain=MS_DOMAIN, **nbits)
    corr = b.op("MatMul", [_blocksum(b, inputs[0], K, G, memo), mins], "mins_term")
    b.op("Add", [y, corr], "add_mins", outputs=outputs)


def _lower_8bit_fp32_activations(
    b: NodeBuilder,
    inputs: list[str],
    outputs: list[str],
    zp: np.ndarray | None,
    inits: InitializerView,
    nbits: dict,
    memo: dict,
) -> None:
    """8-bit blocks (the GGUF Q8_0 LM head) with fp32 activations, exactly, as two 4-bit GEMMs.

    ONNX Runtime's CPU MatMulNBits has no fp32-activation kernel for ``bits=8``: with
    ``accuracy_level`` 0 it dequantizes all of B on every call (measured on a Zen 4 for the
    SmolLM2 head, K=576, N=49152: 95 ms per call at M=1, against 0.9 ms with int8 activations),
    which made every fp32-activation step ~10x slower. Its 4-bit fp32-activation kernel is fast
    (1.0 ms at M=1 for the same shape), so each 8-bit code is split into its nibbles,
    ``q8 = 16*hi + lo``, and with MatMulNBits' implicit 4-bit zero point 8::

        w = d*(q8 - z) = 16d*(hi - 8) + d*(lo - 8) + d*(136 - z)
        Y = MatMulNBits4(A, hi, 16d) + MatMulNBits4(A, lo, d) + blocksum(A) @ (d*(136 - z))^T

    exact in real arithmetic (``16d`` is exact in fp32); the per-block offset shares the
    ``blocksum`` term of :func:`_lower_float_zero_points_exact`. ``zp`` [N, K/G] (uint8 or
    float; None = the implicit 128). Weight bytes: the same codes, two scale arrays.
    """
    K, N, G = nbits["K"], nbits["N"], nbits["block_size"]
    q8 = inits[inputs[1]].reshape(N, K).astype(np.uint8)
    d = inits[inputs[2]].astype(np.float32).reshape(N, K // G)
    z = np.full((N, K // G), 128.0, np.float32) if zp is None else zp.astype(np.float32).reshape(N, K // G)
    four = dict(nbits, bits=4)
    y_hi = b.op(
        "MatMulNBits",
        [inputs[0], b.const(pack_int4(q8 >> 4, G), np.uint8, hint="b_hi"), b.const(16 * d, np.float32, hint="d_hi")],
        "matmul_nbits_hi",
        domain=MS_DOMAIN,
        **four,
    )
    y_lo = b.op(
        "MatMulNBits",
        [inputs[0], b.const(pack_int4(q8 & 15, G), np.uint8, hint="b_lo"), b.const(d, np.float32, hint="d_lo")],
        "matmul_nbits_lo",
        domain=MS_DOMAIN,
        **four,
    )
    offsets = b.const(np.ascontiguousarray((d * (136.0 - z)).T), np.float32, hint="offsets_t")  # [K/G, N]
    corr = b.op("MatMul", [_blocksum(b, inputs[0], K, G, memo), offsets], "offset_term")
    b.op("Add", [b.op("Add", [y_hi, y_lo], "add_nibbles"), corr], "add_offsets", outputs=outputs)


def _blocksum(b: NodeBuilder, a: str, K: int, G: int, memo: dict) -> str:
    """``blocksum(A)[.., g]`` = sum of A over K-group g, [M, K/G]; built once per (A, G) and
    graph (``memo``: ``GraphRewrite.memo``), shared by the linears reading the same A."""
    key = ("int4_gemm_blocksum", a, G)
    if key not in memo:
        r = b.op("Reshape", [a, b.const([-1, K // G, G])], "a_groups")
        memo[key] = b.op("ReduceSum", [r, b.const([-1])], "a_blocksum", keepdims=0)
    return memo[key]


def requantize_float_zp_to_uint8_8bit(
    codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-bit blocks with *float* zero points (GGUF Q4_1: ``w = d*(q - zp)``, ``zp = -m/d``) ->
    8-bit blocks with *integer* zero points, the form ONNX Runtime's MatMulNBits runs fast.

    ``q8 = 16*q + r``, ``d8 = d/16``, ``z8 = r + round(16*zp)`` with ``r = clip(-round(16*zp), 0, 15)``
    so that ``d8*(q8 - z8) = d*q - d*round(16*zp)/16``: each weight of a block moves by the same
    ``d*(16*zp - round(16*zp))/16``, at most ``d/32`` (exact when ``16*zp`` is an integer; a 4-bit
    code step is ``d``). ``z8`` is clipped to 0..255, which only matters for ``zp`` outside
    ``[-15/16, 15.97]`` (a block whose values all lie far from zero).

    codes ``[N, K]`` uint8 0..15; scales, zero_points ``[N, K/G]`` float.
    Returns ``(q8 [N, K/G, G] uint8, d8 [N, K/G] float32, z8 [N, K/G] uint8)``: MatMulNBits
    ``bits=8`` layout (one code per byte, one zero point per byte).
    Raises :class:`OpError` on shapes that do not match.
    """
    check_group_size(codes.shape[1], group_size)
    N, K = codes.shape
    G = int(group_size)
    if scales.shape != (N, K // G) or zero_points.shape != (N, K // G):
        raise OpError(
            f"scales {scales.shape} / zero_points {zero_points.shape}: expected [N, K/G] = "
            f"[{N}, {K // G}] for codes [{N}, {K}] and group_size {G}"
        )
    zp16 = np.round(16.0 * zero_points.astype(np.float64))
    r = np.clip(-zp16, 0, 15)
    z8 = np.clip(r + zp16, 0, 255).astype(np.uint8)
    q8 = (16 * codes.reshape(N, K // G, G).astype(np.int32) + r[..., None].astype(np.int32)).astype(np.uint8)
    d8 = (scales.astype(np.float32) / np.float32(16)).astype(np.float32)
    return q8, d8, z8
