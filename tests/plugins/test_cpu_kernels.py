"""The host CPU kernels (plugins/cpu/csrc) against NumPy: layouts exact, the activation quantizer's
codes and scales bit for bit, GEMMs within stated tolerances of float64 references, paged attention against the
op's NumPy reference (plugins/ops/paged_attention/reference.py). Each ISA this CPU runs is tested
(an AVX-512 host runs both the avx512_vnni and the avx2 builds)."""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import kv_encode
from trtpipe.plugins.cpu import layout, library, reference
from trtpipe.plugins.cpu.compile import compile_library, compiler
from trtpipe.plugins.cpu.isa import ISAS, missing_flags
from trtpipe.plugins.ops.paged_attention.reference import paged_attention

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")
HOST_ISAS = [i for i in ISAS if not missing_flags(i)]


@pytest.fixture(scope="module", params=HOST_ISAS or [pytest.param(None, marks=pytest.mark.skip("no ISA"))])
def lib(request, tmp_path_factory):
    return library.load(compile_library(request.param, tmp_path_factory.mktemp("cpu-kernels")))


def _fp16_exact(rng, shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def _q4(rng, N, K):
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    d, m = _fp16_exact(rng, (N, K // 32), 0.01), _fp16_exact(rng, (N, K // 32), 0.05)
    return q, d, m


def test_q4_layout_dequantizes_to_d_q_plus_m():
    rng = np.random.default_rng(0)
    q, d, m = _q4(rng, 32, 64)
    w = layout.tile_q4(q, d, m)
    # by hand: row 17 (tile 1, row 1), k = 45 (block 1, k-group 5, high nibble, byte 1)
    assert layout.dequantize(w)[17, 45] == np.float32(d[17, 1] * np.float32(q[17, 45]) + m[17, 1])
    byte = w.codes[(1 * (64 // 8) + 5) * 64 + 1 * 4 + 1]
    assert byte >> 4 == q[17, 45] and byte & 15 == q[17, 41]
    assert np.array_equal(layout.dequantize(w), np.repeat(d, 32, 1) * q + np.repeat(m, 32, 1))


def test_q8_layout_dequantizes_to_d_u_minus_128():
    rng = np.random.default_rng(1)
    u = rng.integers(0, 256, (48, 96), dtype=np.uint8)
    d = _fp16_exact(rng, (48, 3), 0.01)
    assert np.array_equal(layout.dequantize(layout.tile_q8(u, d)), np.repeat(d, 32, 1) * (u.astype(np.float32) - 128))


def test_layouts_refuse_what_the_kernels_cannot_take():
    with pytest.raises(OpError, match="N % 16 == 0"):
        layout.tile_q8(np.zeros((8, 32), np.uint8), np.zeros((8, 1), np.float32))
    with pytest.raises(OpError, match="not exact in fp16"):
        layout.tile_q8(np.zeros((16, 32), np.uint8), np.full((16, 1), 0.1, np.float32))
    with pytest.raises(OpError, match="expected 0..15"):
        layout.tile_q4(np.full((16, 32), 16, np.uint8), np.zeros((16, 1)), np.zeros((16, 1)))


@pytest.mark.parametrize("levels", [1, 2])
def test_activation_quantizer_matches_numpy_bit_for_bit(lib, levels):
    x = np.random.default_rng(2).standard_normal((5, 96)).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block: scale 0, codes 0
    got = library.quant_act(lib, x, levels)
    want = reference.quantize_activations(x, levels)
    for k in ("q1", "s1") + (("q2", "s2") if levels == 2 else ()):
        np.testing.assert_array_equal(getattr(got, k), want[k], err_msg=k)
    # block sums: sequential in C, pairwise in NumPy (fp32 rounding of 32 terms)
    np.testing.assert_allclose(got.asum, want["asum"], rtol=0, atol=1e-5 * np.abs(x).max() * 32)


@pytest.mark.parametrize("M", [1, 3, 4, 9])
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_gemm_matches_the_integer_reference_and_the_float_product(lib, kind, M):
    rng = np.random.default_rng(3 + M)
    N, K = 48, 192
    if kind == "q4":
        q, d, m = _q4(rng, N, K)
        w = layout.tile_q4(q, d, m)
    else:
        q, d, m = rng.integers(0, 256, (N, K), dtype=np.uint8), _fp16_exact(rng, (N, K // 32), 0.01), None
        w = layout.tile_q8(q, d)
    x = rng.standard_normal((M, K)).astype(np.float32)
    exact = x.astype(np.float64) @ layout.dequantize(w).astype(np.float64).T
    scale = np.abs(exact).max()
    for levels, tol in ((2, 1e-4), (1, 2e-2)):  # measured: ~3e-5 and ~8e-3 of the largest output
        y = library.gemm(lib, w, x, levels)
        emulated = reference.gemm_from_quantized(reference.quantize_activations(x, levels), q, d, m)
        np.testing.assert_allclose(y, emulated, rtol=0, atol=2e-6 * scale)  # the same arithmetic, fp32 sums
        assert np.abs(y - exact).max() / scale < tol


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_a_rows_gemm_bytes_do_not_depend_on_M_its_group_or_the_threads(lib, kind):
    """Batch invariance at the kernel: each row computed alone (M = 1) equals, bit for bit, the same
    row inside M = 2..21 (AVX-512: groups of up to 8 rows to M = 16, split evenly such as 9 = 4 + 5
    and 13 = 6 + 7, then the groups-of-4 kernel at 17 and 21; AVX2: groups of up to 4), with one
    thread or two."""
    rng = np.random.default_rng(6)
    N, K, rows = 32, 96, 21
    w = (
        layout.tile_q4(*_q4(rng, N, K))
        if kind == "q4"
        else layout.tile_q8(rng.integers(0, 256, (N, K), dtype=np.uint8), _fp16_exact(rng, (N, K // 32), 0.01))
    )
    x = rng.standard_normal((rows, K)).astype(np.float32)
    threads = lib.tp_get_threads()
    try:
        for levels in (1, 2):
            lib.tp_set_threads(1)
            alone = np.concatenate([library.gemm(lib, w, x[i : i + 1], levels) for i in range(rows)])
            for n_threads in (1, 2):
                lib.tp_set_threads(n_threads)
                for M in (2, 3, 5, 7, 8, 9, 13, 16, 17, 21):
                    got = library.gemm(lib, w, x[:M], levels)
                    assert got.tobytes() == alone[:M].tobytes(), (levels, n_threads, M)
    finally:
        lib.tp_set_threads(threads)


ATTENTION_CASES = {
    # H, KVH, D, BS, chunk lengths, context lengths: small shapes (the kernels' plain loops) and
    # SmolLM2's (9:3 heads, D 64, blocks of 16: the vector paths), with a 40-token chunk (3 query blocks)
    "small": (4, 2, 16, 4, [3, 6, 1], [9, 6, 11]),
    "smollm2": (9, 3, 64, 16, [40, 17, 1], [75, 17, 50]),
}


def _attention_inputs(case: str, kv_dtype: str):
    """A prefill chunk continuing a cached prefix, a fresh prompt and a 1-token decode row (GQA,
    scattered blocks); the pool filled with random values encoded in ``kv_dtype``."""
    rng = np.random.default_rng(4)
    H, KVH, D, BS, chunks, ctx = ATTENTION_CASES[case]
    S, T = len(chunks), sum(chunks)
    MB = max(-(-c // BS) for c in ctx)
    NB = S * MB + 2
    perm = rng.permutation(np.arange(1, NB))  # scattered physical blocks, 0 the null block
    tables = np.zeros((S, MB), np.int64)
    for s in range(S):
        n = -(-ctx[s] // BS)
        tables[s, :n] = perm[s * MB : s * MB + n]
    qsl = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    slots = np.concatenate(
        [[tables[s, p // BS] * BS + p % BS for p in range(ctx[s] - chunks[s], ctx[s])] for s in range(S)]
    ).astype(np.int64)
    kc, ks = kv_encode(rng.standard_normal((KVH, NB, BS, D)), kv_dtype)
    vc, vs = kv_encode(rng.standard_normal((KVH, NB, BS, D)), kv_dtype)
    q = rng.standard_normal((T, H * D)).astype(np.float32)
    k = rng.standard_normal((T, KVH * D)).astype(np.float32)
    v = rng.standard_normal((T, KVH * D)).astype(np.float32)
    k[0, :D] = 0.0  # an all-zero int8 row: scale 0, codes 0
    return (q, k, v, kc, vc, slots, tables, np.array(ctx, np.int64), qsl, ks, vs), (H, KVH, D, BS, S, T, MB, NB)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_paged_attention_matches_the_op_reference(lib, window, case, kv_dtype):
    """Prefill chunks and a decode row in one call against plugins/ops/paged_attention/reference.py,
    for each KV pool dtype: the written codes and int8 scales bit for bit (the same float32
    operations as kv_codec.kv_encode), the output within 1e-5 (both read the same decoded values;
    fp32 sums in another order)."""
    args, (H, KVH, D, BS, S, T, MB, NB) = _attention_inputs(case, kv_dtype)
    q, k, v, kc, vc, slots, tables, ctx_a, qsl, ks, vs = args
    want, *pool_want = paged_attention(
        *args, num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window
    )
    f32p, i64p = library._f32p, library._i64p
    kv = library.kv_struct(kc, vc, ks, vs)
    lib.tp_kv_write(
        C.byref(kv), library.ptr(k, f32p), library.ptr(v, f32p), KVH * D, library.ptr(slots, i64p), T, KVH, NB, BS, D
    )
    for got, expected in zip([kc, vc] + ([ks, vs] if ks is not None else []), pool_want, strict=True):
        np.testing.assert_array_equal(got, expected)
    out = np.zeros((T, H * D), np.float32)
    lib.tp_attention(
        library.ptr(q, f32p), H * D, C.byref(kv), library.ptr(tables, i64p), MB,
        library.ptr(ctx_a, i64p), library.ptr(qsl, i64p), S, H, KVH, NB, BS, D, C.c_float(D**-0.5), window,
        library.ptr(out, f32p),
    )  # fmt: skip
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_silu_mul_and_rmsnorm_match_numpy(lib):
    rng = np.random.default_rng(5)
    F, M = 72, 3  # 72: vector lanes and a scalar tail
    gu = (rng.standard_normal((M, 2 * F)) * 4).astype(np.float32)
    gu[0, :4] = [-100.0, 100.0, 0.0, -87.5]  # exp under- and overflow edges
    y = np.zeros((M, F), np.float32)
    lib.tp_silu_mul(library.ptr(gu, library._f32p), library.ptr(y, library._f32p), M, F)
    g, u = gu[:, :F].astype(np.float64), gu[:, F:].astype(np.float64)
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * u, rtol=2e-6, atol=1e-30)
    x = rng.standard_normal((M, 96)).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    out = np.zeros_like(x)
    lib.tp_rmsnorm(
        library.ptr(x, library._f32p), library.ptr(w, library._f32p), 1e-5, library.ptr(out, library._f32p), M, 96
    )
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, w * x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5), rtol=2e-6, atol=1e-7)


def test_unknown_isa_and_missing_flags_are_named():
    with pytest.raises(OpError, match="expected one of avx512_vnni, avx2"):
        compile_library("amx")
    assert missing_flags("avx512_vnni", frozenset({"avx2", "fma", "f16c"}))[:1] == ["avx512f"]
