"""Tests of INT4 packing, RTN quantization and GGUF repacking (plugins/ops/int4_gemm/pack.py).

GGUF blocks are synthesized with ``gguf.quants.quantize`` and compared against
``gguf.quants.dequantize``; MatMulNBits layouts are checked against ONNX Runtime's CPU kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm import pack as P
from trtpipe.plugins.ops.int4_gemm import reference as R

gguf = pytest.importorskip("gguf")
QT = gguf.GGMLQuantizationType


def _weights(rng, N, K):
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[:, :32] += 3.0  # an all-positive block (min > 0) and mixed scales
    return w * rng.uniform(0.01, 2.0, (N, 1)).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# packing
# ----------------------------------------------------------------------------------------------


def test_pack_int4_nibble_order_and_roundtrip():
    codes = np.tile(np.arange(16, dtype=np.uint8), (3, 4))  # [3, 64]
    packed = P.pack_int4(codes, 32)
    assert packed.shape == (3, 2, 16) and packed.dtype == np.uint8
    assert packed[0, 0, 0] == 0x10 and packed[0, 0, 7] == 0xFE  # (0, 1) and (14, 15)
    np.testing.assert_array_equal(P.unpack_int4(packed, 64, 32), codes)
    rng = np.random.default_rng(0)
    for N in (1, 3):
        c = rng.integers(0, 16, (N, 128))
        np.testing.assert_array_equal(P.unpack_int4(P.pack_int4(c, 64), 128, 64), c)


def test_zero_points_pack_roundtrip_extremes():
    zp = np.array([[0, 15, 7], [15, 0, 8]], np.uint8)  # odd number of blocks
    packed = P.pack_zero_points_uint8(zp)
    assert packed.shape == (2, 2)
    assert packed[0, 0] == 0xF0 and packed[1, 0] == 0x0F and packed[0, 1] == 0x07
    np.testing.assert_array_equal(P.unpack_zero_points_uint8(packed, 2, 3), zp)


def test_packing_errors():
    with pytest.raises(OpError, match="0..15"):
        P.pack_int4(np.full((1, 32), 16), 32)
    with pytest.raises(OpError, match=r"K=48 is not a multiple of group_size=32.*\[16\]"):
        P.pack_int4(np.zeros((1, 48), np.uint8), 32)
    with pytest.raises(OpError, match="power of two >= 16"):
        P.pack_int4(np.zeros((1, 48), np.uint8), 8)
    with pytest.raises(OpError, match="0..15"):
        P.pack_zero_points_uint8(np.array([[16]]))


def test_zero_points_float_every_stored_form_by_hand():
    np.testing.assert_array_equal(P.zero_points_float(None, 2, 3), np.full((2, 3), 8.0, np.float32))
    packed = np.array([[0x21, 0x03], [0xF0, 0x0E]], np.uint8)  # row 0: blocks 1, 2, 3; row 1: 0, 15, 14
    np.testing.assert_array_equal(P.zero_points_float(packed, 2, 3), [[1, 2, 3], [0, 15, 14]])
    zf = np.array([[-0.5, 7.25, 8.0]], np.float16)
    got = P.zero_points_float(zf, 1, 3)
    assert got.dtype == np.float32 and got.tolist() == [[-0.5, 7.25, 8.0]]
    with pytest.raises(OpError, match=r"expected float \[N, K/G\] = \[1, 2\]"):
        P.zero_points_float(zf, 1, 2)
    with pytest.raises(OpError, match="packed uint8"):
        P.zero_points_float(packed, 2, 5)


def test_dequantize_codes_by_hand():
    codes = np.array([[0, 15] * 8 + [8] * 16], np.uint8)  # [1, 32], G = 16: two blocks
    w = P.dequantize_codes(codes, np.array([[0.5, 2.0]], np.float16), np.array([[8.0, 7.5]], np.float32), 16)
    assert w.dtype == np.float32 and w.shape == (1, 32)
    np.testing.assert_array_equal(w[0, :2], [(0 - 8) * 0.5, (15 - 8) * 0.5])
    np.testing.assert_array_equal(w[0, 16:], np.full(16, (8 - 7.5) * 2.0))


def test_unpack_int4_codes_nibble_order_by_hand():
    b = np.zeros((1, 1, 8), np.uint8)
    b[0, 0, 0], b[0, 0, 7] = 0x21, 0xF0  # codes 0, 1 = 1, 2; codes 14, 15 = 0, 15
    codes = P.unpack_int4_codes(b, 16, 1, 16)
    assert codes[0, :2].tolist() == [1, 2] and codes[0, 14:].tolist() == [0, 15] and codes[0, 2:14].sum() == 0
    assert R.unpack_int4_codes is P.unpack_int4_codes  # the reference uses the one layout home


# ----------------------------------------------------------------------------------------------
# RTN
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("N", [1, 3])
def test_quantize_rtn_error_bound(symmetric, N):
    rng = np.random.default_rng(N)
    K, G = 128, 32
    w = _weights(rng, N, K)
    w[0, 64:96] = 0.0  # all-zero block
    packed, scales, zp = P.quantize_rtn(w, G, symmetric)
    assert packed.shape == (N, K // G, G // 2) and scales.shape == (N, K // G)
    assert (zp is None) == symmetric
    if not symmetric:
        assert zp.shape == (N, 2) and zp.dtype == np.uint8
    deq = R.dequantize_int4(packed, scales, zp, K, N, G)
    bound = np.repeat(scales, G, axis=1) / 2
    err = np.abs(w - deq)
    assert np.all(err <= bound * (1 + 1e-6) + 1e-7), float((err - bound).max())
    assert np.all(deq[0, 64:96] == 0.0)


def test_quantize_rtn_uses_zero_point_extremes():
    w = np.zeros((2, 32), np.float32)
    w[0] = np.linspace(0.0, 1.0, 32)  # min = 0 -> zp 0
    w[1] = np.linspace(-1.0, 0.0, 32)  # max = 0 -> zp 15
    _, scales, zp = P.quantize_rtn(w, 32, symmetric=False)
    np.testing.assert_array_equal(P.unpack_zero_points_uint8(zp, 2, 1), [[0], [15]])
    np.testing.assert_allclose(scales[:, 0], [1 / 15, 1 / 15], rtol=1e-6)


def test_quantize_rtn_errors():
    with pytest.raises(OpError, match=r"K=100 is not a multiple of group_size=32"):
        P.quantize_rtn(np.zeros((2, 100), np.float32), 32, True)
    with pytest.raises(OpError, match="NaN"):
        P.quantize_rtn(np.full((1, 32), np.nan, np.float32), 32, True)


# ----------------------------------------------------------------------------------------------
# GGUF repacking
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N", [1, 3, 8])
def test_repack_q4_0_bit_exact(N):
    rng = np.random.default_rng(N)
    K = 96  # odd number of blocks -> padded zero-point nibble
    raw = gguf.quants.quantize(_weights(rng, N, K), QT.Q4_0)
    assert raw.shape == (N, K // 32 * 18)
    expected = gguf.quants.dequantize(raw, QT.Q4_0)
    packed, scales, zp = P.repack_gguf_q4_0(raw, N, K)
    assert packed.shape == (N, 3, 16) and scales.shape == (N, 3) and zp.shape == (N, 2)
    np.testing.assert_array_equal(P.unpack_zero_points_uint8(zp, N, 3), 8)
    np.testing.assert_array_equal(R.dequantize_int4(packed, scales, zp, K, N, 32), expected)
    np.testing.assert_array_equal(R.dequantize_int4(packed, scales, None, K, N, 32), expected)


def _q4_1_raw(rng, N, K):
    w = _weights(rng, N, K)
    w[0, 32:64] = 0.75  # constant block -> d == 0, m = 0.75
    if N > 1:
        w[1, 0:32] = 0.0  # d == 0, m == 0
    return gguf.quants.quantize(w, QT.Q4_1)


@pytest.mark.parametrize("N", [1, 3])
def test_repack_q4_1_exact_form_is_bit_exact(N):
    rng = np.random.default_rng(10 + N)
    K = 128
    raw = _q4_1_raw(rng, N, K)
    expected = gguf.quants.dequantize(raw, QT.Q4_1)
    packed, d, m = P.repack_gguf_q4_1_exact(raw, N, K)
    assert (d == 0).any()
    q = P.unpack_int4(packed, K, 32).astype(np.float32).reshape(N, K // 32, 32)
    got = (q * d[..., None] + m[..., None]).reshape(N, K)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("N", [1, 3])
def test_repack_q4_1_float_zero_points(N):
    rng = np.random.default_rng(20 + N)
    K = 256
    raw = _q4_1_raw(rng, N, K)
    expected = gguf.quants.dequantize(raw, QT.Q4_1)
    packed, scales, zp = P.repack_gguf_q4_1(raw, N, K)
    assert zp.dtype == np.float32 and zp.shape == (N, K // 32) and np.all(np.isfinite(zp))
    got = R.dequantize_int4(packed, scales, zp, K, N, 32)
    # d == 0 blocks are rewritten to be exact
    np.testing.assert_array_equal(got[0, 32:64], expected[0, 32:64])
    assert np.all(got[0, 32:64] == np.float32(np.float16(0.75)))
    if N > 1:
        np.testing.assert_array_equal(got[1, :32], 0.0)
    # elsewhere (q - (-m/d)) * d vs q*d + m: error relative to the block magnitude
    _, d, m = P.repack_gguf_q4_1_exact(raw, N, K)
    block_mag = np.maximum(np.repeat(np.abs(d) * 15 + np.abs(m), 32, axis=1), np.float32(1e-30))
    rel = np.abs(got - expected) / block_mag
    assert rel.max() < 3e-7, rel.max()  # measured ~1.2e-7 (about 1 ulp of the block range)


def test_q8_0_dequantize_and_uint8_repack_exact():
    rng = np.random.default_rng(3)
    N, K = 3, 64
    raw = gguf.quants.quantize(_weights(rng, N, K), QT.Q8_0)
    expected = gguf.quants.dequantize(raw, QT.Q8_0)
    np.testing.assert_array_equal(P.dequantize_gguf_q8_0(raw, N, K), expected)
    codes, scales = P.repack_gguf_q8_0_as_uint8(raw, N, K)
    assert codes.shape == (N, 2, 32) and codes.dtype == np.uint8 and scales.shape == (N, 2)
    got = (codes.astype(np.float32) - 128) * scales[..., None]
    np.testing.assert_array_equal(got.reshape(N, K), expected)


def test_gguf_size_errors():
    raw = np.zeros((2, 40), np.uint8)
    with pytest.raises(OpError, match=r"expected N\*K/32\*20 = 60"):
        P.repack_gguf_q4_1(raw, 3, 32)
    with pytest.raises(OpError, match="multiple of 32"):
        P.repack_gguf_q4_0(raw, 2, 48)
    with pytest.raises(OpError, match="uint8"):
        P.repack_gguf_q4_1(raw.astype(np.int8), 2, 64)


# ----------------------------------------------------------------------------------------------
# ONNX Runtime MatMulNBits agrees with the reference (CPU EP)
# ----------------------------------------------------------------------------------------------


def _matmulnbits_session(K, N, G, bits, zp_type, zp_shape=None):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper

    inputs = [
        helper.make_tensor_value_info("A", TP.FLOAT, ["M", K]),
        helper.make_tensor_value_info("B", TP.UINT8, [N, K // G, G * bits // 8]),
        helper.make_tensor_value_info("scales", TP.FLOAT, [N, K // G]),
    ]
    if zp_type is not None:
        inputs.append(helper.make_tensor_value_info("zero_points", zp_type, list(zp_shape)))
    node = helper.make_node(
        "MatMulNBits", [i.name for i in inputs], ["Y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=G
    )
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TP.FLOAT, ["M", N])])
    model = helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    return sess


def _rel(y, ref):
    return float(np.abs(y - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("N", [1, 3, 40])
def test_ort_matmulnbits_matches_reference(N):
    from onnx import TensorProto as TP

    rng = np.random.default_rng(N)
    K, G = 96, 32
    a = rng.standard_normal((4, K)).astype(np.float32)
    w = _weights(rng, N, K)
    # uint8 zero points (asymmetric RTN), odd number of blocks
    packed, scales, zp = P.quantize_rtn(w, G, symmetric=False)
    ref = R.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
    y = _matmulnbits_session(K, N, G, 4, TP.UINT8, zp.shape).run(
        None, {"A": a, "B": packed, "scales": scales, "zero_points": zp}
    )[0]
    assert _rel(y, ref) < 1e-4
    # no zero points (symmetric)
    packed, scales, _ = P.quantize_rtn(w, G, symmetric=True)
    ref = R.int4_gemm(a, packed, scales, K=K, N=N, group_size=G)
    y = _matmulnbits_session(K, N, G, 4, None).run(None, {"A": a, "B": packed, "scales": scales})[0]
    assert _rel(y, ref) < 1e-4
    # float zero points (GGUF Q4_1), compared with the reference and with gguf's own dequantization
    raw = _q4_1_raw(rng, N, K)
    packed, scales, zpf = P.repack_gguf_q4_1(raw, N, K)
    ref = R.int4_gemm(a, packed, scales, zpf, K=K, N=N, group_size=G)
    y = _matmulnbits_session(K, N, G, 4, TP.FLOAT, zpf.shape).run(
        None, {"A": a, "B": packed, "scales": scales, "zero_points": zpf}
    )[0]
    assert _rel(y, ref) < 1e-4
    assert _rel(y, a @ gguf.quants.dequantize(raw, QT.Q4_1).T) < 1e-4


def test_ort_matmulnbits_8bit_runs_q8_0():
    """8-bit MatMulNBits (default zero point 128) runs on this ORT build: an 8-bit lm_head."""
    rng = np.random.default_rng(7)
    N, K = 24, 64
    raw = gguf.quants.quantize(_weights(rng, N, K), QT.Q8_0)
    codes, scales = P.repack_gguf_q8_0_as_uint8(raw, N, K)
    a = rng.standard_normal((2, K)).astype(np.float32)
    y = _matmulnbits_session(K, N, 32, 8, None).run(None, {"A": a, "B": codes, "scales": scales})[0]
    assert _rel(y, a @ P.dequantize_gguf_q8_0(raw, N, K).T) < 1e-4


def test_float_zero_point_requant_to_8bit_moves_each_weight_at_most_d_over_32():
    """Hand check of ``requantize_float_zp_to_uint8_8bit``: w8 = d/16 * (q8 - z8) vs w = d * (q - zp)."""
    pytest.importorskip("onnx")
    from trtpipe.plugins.ops.int4_gemm.lower_ort import requantize_float_zp_to_uint8_8bit

    rng = np.random.default_rng(3)
    N, K, G = 6, 64, 32
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(N, K // G)).astype(np.float32)
    zp = rng.uniform(0.0, 15.0, size=(N, K // G)).astype(np.float32)
    zp[0, 0] = 7.25  # 16 * zp integer: exact
    zp[0, 1] = 0.0
    q8, d8, z8 = requantize_float_zp_to_uint8_8bit(codes, scales, zp, G)
    assert q8.shape == (N, K // G, G) and q8.dtype == np.uint8 and z8.dtype == np.uint8
    w = (codes.reshape(N, K // G, G) - zp[..., None].astype(np.float64)) * scales[..., None]
    w8 = (q8.astype(np.float64) - z8[..., None]) * d8[..., None]
    err = np.abs(w8 - w)
    assert np.all(err <= scales[..., None] / 32 * (1 + 1e-6) + 1e-9)
    assert err[0, :2].max() < 1e-6
    # the shift is the same for every weight of a block (a per-block bias, not noise)
    assert np.allclose(err.max(-1), err.min(-1), atol=1e-7)
    with pytest.raises(OpError, match="expected \\[N, K/G\\]"):
        requantize_float_zp_to_uint8_8bit(codes, scales[:, :1], zp, G)


# --------------------------------------------------------------------------------------------
# symmetric re-quantization for TensorRT's INT4 DequantizeLinear (no zero point)
# --------------------------------------------------------------------------------------------


def test_symmetric_mse_beats_plain_rtn_per_block_and_uses_fp16_scales():
    rng = np.random.default_rng(11)
    N, K, G = 64, 256, 32
    w = rng.standard_normal((N, K)).astype(np.float32) * rng.uniform(0.01, 2.0, (N, 1)).astype(np.float32)
    w[3, :G] = 0.0  # an all-zero block
    packed, scales = P.quantize_symmetric_mse(w, G)
    assert packed.shape == (N, K // G, G // 2) and scales.shape == (N, K // G) and scales.dtype == np.float32
    np.testing.assert_array_equal(scales.astype(np.float16).astype(np.float32), scales)  # exact in fp16
    assert scales[3, 0] == 1.0 and np.all(scales > 0)  # never a zero scale
    deq = R.dequantize_int4(packed, scales, None, K, N, G)
    assert np.all(deq[3, :G] == 0.0)
    rtn_packed, rtn_scales, _ = P.quantize_rtn(w, G, symmetric=True)
    rtn = R.dequantize_int4(rtn_packed, rtn_scales.astype(np.float16).astype(np.float32), None, K, N, G)
    err = np.square(w - deq).reshape(N, K // G, G).sum(-1)
    err_rtn = np.square(w - rtn).reshape(N, K // G, G).sum(-1)
    # d = 7 (plain RTN) is one of the candidates, so no block gets worse (up to the fp16 scale rounding
    # of the candidate vs RTN's own scale), and the total error drops
    assert np.all(err <= err_rtn * (1 + 1e-3) + 1e-12)
    assert err.sum() < 0.95 * err_rtn.sum()


def test_requantize_symmetric_of_gguf_q4_1_blocks_stays_close():
    rng = np.random.default_rng(12)
    N, K = 8, 128
    d = rng.uniform(0.01, 0.05, (N, K // 32)).astype(np.float16)
    m = -rng.uniform(0.0, 0.3, (N, K // 32)).astype(np.float16)
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    w = q.reshape(N, K // 32, 32) * d.astype(np.float32)[..., None] + m.astype(np.float32)[..., None]
    packed = P.pack_int4(q, 32)
    zp = (-m.astype(np.float32) / d.astype(np.float32)).astype(np.float32)
    new_packed, new_scales = P.requantize_symmetric(packed, d.astype(np.float32), zp, K, N, 32)
    deq = R.dequantize_int4(new_packed, new_scales, None, K, N, 32).reshape(N, K // 32, 32)
    absmax = np.abs(w).max(-1, keepdims=True)
    # within a (new) code step of absmax/6 everywhere: the widest candidate step, clipping included
    assert np.all(np.abs(deq - w) <= absmax / 6 + 1e-6)
    assert np.sqrt(np.mean((deq - w) ** 2)) < 0.35 * np.sqrt(np.mean(w**2))
