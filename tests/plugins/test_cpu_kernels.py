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
from trtpipe.plugins.cpu.compile import act_form_flags, compile_library, compiler
from trtpipe.plugins.cpu.isa import ACT_FORM, ISAS, act_forms_of, missing_flags
from trtpipe.plugins.ops.paged_attention.reference import paged_attention

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")
HOST_ISAS = [i for i in ISAS if not missing_flags(i)]
# (ISA, how levels = 2 is held): the avx2 build in both forms (csrc/tp.h)
HOST_BUILDS = [(i, f) for i in HOST_ISAS for f in act_forms_of(i)]


@pytest.fixture(scope="module", params=HOST_ISAS or [pytest.param(None, marks=pytest.mark.skip("no ISA"))])
def lib(request, tmp_path_factory):
    """Each host ISA's library in its own form (isa.ACT_FORM): what attention and the ops run on."""
    return library.load(compile_library(request.param, tmp_path_factory.mktemp("cpu-kernels")))


@pytest.fixture(scope="module", params=HOST_BUILDS or [pytest.param(None, marks=pytest.mark.skip("no ISA"))], ids=str)
def gemm_lib(request, tmp_path_factory):
    """Every (ISA, form) build this CPU runs: what the quantizer and GEMM tests run on."""
    isa, form = request.param
    return library.load(compile_library(isa, tmp_path_factory.mktemp("cpu-kernels"), form=form))


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
def test_activation_quantizer_matches_numpy_bit_for_bit(gemm_lib, levels):
    x = np.random.default_rng(2).standard_normal((5, 96)).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block: scale 0, codes 0
    got = library.quant_act(gemm_lib, x, levels)
    want = reference.quantize_activations(x, levels, library.act_form(gemm_lib))
    np.testing.assert_array_equal(got.s1, want["s1"])
    if levels == 2 and library.act_form(gemm_lib) == "int16":  # one int16 level, its 4-groups as (0, 2, 1, 3)
        np.testing.assert_array_equal(library.int16_codes(got), want["q1"])
        np.testing.assert_array_equal(got.q16[0, :4], want["q1"][0, [0, 2, 1, 3]])
        np.testing.assert_array_equal(got.qsum1, want["q1"].reshape(5, 3, 32).sum(2, dtype=np.int32))
        assert np.abs(want["q1"][0, :32]).max() == 32767  # a block's largest |x| at full scale
    else:
        for k in ("q1",) + (("q2", "s2") if levels == 2 else ()):
            np.testing.assert_array_equal(getattr(got, k), want[k], err_msg=k)
    # block sums: sequential in C, pairwise in NumPy (fp32 rounding of 32 terms)
    np.testing.assert_allclose(got.asum, want["asum"], rtol=0, atol=1e-5 * np.abs(x).max() * 32)


@pytest.mark.parametrize("M", [1, 3, 4, 9])
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_gemm_matches_the_integer_reference_and_the_float_product(gemm_lib, kind, M):
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
        y = library.gemm(gemm_lib, w, x, levels)
        emulated = reference.gemm_from_quantized(
            reference.quantize_activations(x, levels, library.act_form(gemm_lib)), q, d, m
        )
        np.testing.assert_allclose(y, emulated, rtol=0, atol=2e-6 * scale)  # the same arithmetic, fp32 sums
        assert np.abs(y - exact).max() / scale < tol


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_a_rows_gemm_bytes_do_not_depend_on_M_its_group_or_the_threads(gemm_lib, kind):
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
    threads = gemm_lib.tp_get_threads()
    try:
        for levels in (1, 2):
            gemm_lib.tp_set_threads(1)
            alone = np.concatenate([library.gemm(gemm_lib, w, x[i : i + 1], levels) for i in range(rows)])
            for n_threads in (1, 2):
                gemm_lib.tp_set_threads(n_threads)
                for M in (2, 3, 5, 7, 8, 9, 13, 16, 17, 21):
                    got = library.gemm(gemm_lib, w, x[:M], levels)
                    assert got.tobytes() == alone[:M].tobytes(), (levels, n_threads, M)
    finally:
        gemm_lib.tp_set_threads(threads)


ATTENTION_CASES = {
    # H, KVH, D, BS, chunk lengths, context lengths: small shapes (the kernels' plain loops) and
    # SmolLM2's (9:3 heads, D 64, blocks of 16: the vector paths), with a 40-token chunk (3 query blocks)
    "small": (4, 2, 16, 4, [3, 6, 1], [9, 6, 11]),
    "smollm2": (9, 3, 64, 16, [40, 17, 1], [75, 17, 50]),
    # contexts over attention.c's 1024-key partitions: a chunk's rows and a decode row whose keys
    # span 3 and 2 partitions, merged (window 1060: partition 0 seen by the chunk's first rows only)
    "partitions": (9, 3, 64, 16, [40, 1], [2100, 1500]),
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
@pytest.mark.parametrize("window", [0, 5, 1060])
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
    rc = lib.tp_attention(
        library.ptr(q, f32p), H * D, C.byref(kv), library.ptr(tables, i64p), MB,
        library.ptr(ctx_a, i64p), library.ptr(qsl, i64p), S, H, KVH, NB, BS, D, C.c_float(D**-0.5), window,
        library.ptr(out, f32p), None,
    )  # fmt: skip
    assert rc == 0
    if not (kv_dtype == "int8" and int8_scores_path(lib, D, BS)):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        return
    # The int8 score path (csrc/attention_i8.h) computes with the query in two int8 levels: against
    # the reference fed that query, the same 1e-5; against the plain reference, the query's error
    # (<= max|q| / 32,512 per element) moves these unit-normal outputs by <= 2e-4 (up to 1.2e-4
    # measured). The path ran: the kernel sits 10x closer to the two-level reference than to the
    # plain one (the fp32-decoding path, e.g. avx2's, sits closer to the plain one).
    attrs = dict(num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window)
    q_levels = two_level_query(q, D, D**-0.5) / np.float32(D**-0.5)
    want_levels = paged_attention(q_levels, *args[1:], **attrs)[0]
    np.testing.assert_allclose(out, want_levels, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-4)
    assert 10 * np.abs(out - want_levels).max() < np.abs(out - want).max()


def _attend(lib, q, kv, tables, ctx, qsl, shape, window):
    """tp_attention's output [T, H*D] for the given rows (the pool as it is: nothing written)."""
    H, KVH, D, BS, NB = shape
    f32p, i64p = library._f32p, library._i64p
    tables, ctx, qsl = (np.ascontiguousarray(x, np.int64) for x in (tables, ctx, qsl))
    q = np.ascontiguousarray(q, np.float32)
    out = np.zeros((q.shape[0], H * D), np.float32)
    rc = lib.tp_attention(
        library.ptr(q, f32p), H * D, C.byref(kv), library.ptr(tables, i64p), tables.shape[1],
        library.ptr(ctx, i64p), library.ptr(qsl, i64p), len(ctx), H, KVH, NB, BS, D, C.c_float(D**-0.5), window,
        library.ptr(out, f32p), None,
    )  # fmt: skip
    assert rc == 0
    return out


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
@pytest.mark.parametrize("window", [0, 1060])  # 1060: partition 0 seen by the first rows only
def test_attention_rows_do_not_depend_on_their_chunk_or_batch(lib, kv_dtype, window):
    """A row's output is the same bits as a prompt chunk's row, as a decode row and beside another
    sequence, with keys over several of attention.c's 1024-key partitions (whose cuts are absolute
    positions: speculative verification and batch invariance rely on it)."""
    rng = np.random.default_rng(8)
    H, KVH, D, BS, ctx, n = 9, 3, 64, 16, 2100, 40
    nb_seq = -(-ctx // BS)
    NB = 2 * nb_seq + 1
    kc, ks = kv_encode(rng.standard_normal((KVH, NB, BS, D)), kv_dtype)
    vc, vs = kv_encode(rng.standard_normal((KVH, NB, BS, D)), kv_dtype)
    kv = library.kv_struct(kc, vc, ks, vs)
    shape = (H, KVH, D, BS, NB)
    table_a = np.arange(1, 1 + nb_seq)[None]
    table_b = np.arange(1 + nb_seq, 1 + 2 * nb_seq)[None]
    q = rng.standard_normal((n + 1, H * D)).astype(np.float32)
    chunk = _attend(lib, q[:n], kv, table_a, [ctx], [0, n], shape, window)
    for i in (0, 17, n - 1):  # a decode row at position ctx - n + i: context ctx - n + i + 1
        row = _attend(lib, q[i : i + 1], kv, table_a, [ctx - n + i + 1], [0, 1], shape, window)
        assert row.tobytes() == chunk[i : i + 1].tobytes(), i
    both = np.concatenate([table_b, table_a])
    beside = _attend(lib, np.concatenate([q[n:], q[:n]]), kv, both, [900, ctx], [0, 1, 1 + n], shape, window)
    assert beside[1:].tobytes() == chunk.tobytes()


def int8_scores_path(lib, D: int, BS: int) -> bool:
    """Whether tp_attention scores an int8 pool with integer dots (attention_i8.h's condition)."""
    return lib.tp_isa().decode() == "avx512_vnni" and D % 64 == 0 and D <= 256 and BS % 16 == 0


def two_level_query(q: np.ndarray, D: int, scale: float) -> np.ndarray:
    """NumPy model of attention_i8.h's i8_quant_query: each D-row of ``q * scale`` as
    ``s * (256 a + b)`` (float32 operations in the kernel's order, rint half to even)."""
    x = q.reshape(-1, D).astype(np.float32) * np.float32(scale)
    mx = np.abs(x).max(axis=1, keepdims=True)
    ok = mx >= np.finfo(np.float32).tiny  # a zero or subnormal row: codes 0, step 0
    s1 = np.where(ok, mx / np.float32(127), np.float32(0)).astype(np.float32)
    inv1 = np.where(ok, np.float32(127) / np.where(ok, mx, np.float32(1)), np.float32(0)).astype(np.float32)
    a = np.clip(np.rint(x * inv1), -127, 127).astype(np.float32)
    b = np.clip(np.rint((x - a * s1) * (inv1 * np.float32(256))), -127, 127).astype(np.float32)
    return ((np.float32(256) * a + b) * (s1 / np.float32(256))).reshape(q.shape).astype(np.float32)


def test_two_level_query_keeps_fifteen_bits():
    """The model above against the bound attention_i8.h states: |q - q_hat| <= max|q| / (127 * 256)
    per row (hand-derived: the second level's step is max|q| / 32,512; rounding costs half a step,
    a residual of 128 steps clipped to 127 a whole one), and an all-zero row stays zero."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((5, 64)).astype(np.float32) * np.float32(3)
    q[2] = 0.0
    got = two_level_query(q, 64, 1.0)
    bound = np.abs(q).max(axis=1, keepdims=True) / (127 * 256) * (1 + 1e-3)
    assert (np.abs(got - q) <= bound).all()
    assert not got[2].any()
    assert np.abs(got - q).max() > 0


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


def test_the_int16_form_is_avx2s_and_is_refused_elsewhere(tmp_path):
    """Each ISA's form of levels 2 (isa.ACT_FORM): avx2 one int16 level, avx512_vnni two int8
    levels; int16 on avx512_vnni (no kernel written) and unknown forms are refused by name."""
    assert ACT_FORM == {"avx512_vnni": "int8x2", "avx2": "int16"}
    assert act_form_flags("avx2") == ["-DTP_ACT_I16"] and act_form_flags("avx2", "int8x2") == []
    assert act_form_flags("avx512_vnni") == []
    with pytest.raises(OpError, match=r"activation form 'int16' for avx512_vnni: expected int8x2, or int16 on avx2"):
        compile_library("avx512_vnni", tmp_path, form="int16")
    with pytest.raises(OpError, match="activation form 'int4'"):
        act_form_flags("avx2", "int4")
