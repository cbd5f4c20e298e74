"""The host CPU kernels' I8 weight kind (GGUF's kernel form, plugins/core/gguf_blocks) against
NumPy: the layout's dequantization bit for bit ``dequantize_kernel_form`` (itself bit-exact with
gguf-py, tests/plugins/test_gguf_blocks.py), the GEMM within stated tolerances of the float64
emulation of its arithmetic (reference.gemm_i8_from_quantized) and of the float product, a row's
bits independent of its batch, fused linears of mixed kinds exact, and the AVX-512 variant
compiled (this Zen 3 host cannot run it). Weights come from random GGUF blocks (random bytes, as
test_gguf_blocks does) decoded by gguf_blocks."""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks import GGUF_BLOCK_TYPES, KernelBlocks, decode_blocks, dequantize_kernel_form
from trtpipe.plugins.cpu import layout, library, reference
from trtpipe.plugins.cpu.compile import compile_library, compiler
from trtpipe.plugins.cpu.isa import ISAS, act_forms_of, missing_flags

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")
HOST_ISAS = [i for i in ISAS if not missing_flags(i)]
# (ISA, how levels = 2 is held): the avx2 build in both forms (csrc/tp.h)
HOST_BUILDS = [(i, f) for i in HOST_ISAS for f in act_forms_of(i)]
FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,)}
FP16_AT |= {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
GEMM_TYPES = ["Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_1"]


@pytest.fixture(scope="module", params=HOST_BUILDS or [pytest.param(None, marks=pytest.mark.skip("no ISA"))], ids=str)
def lib(request, tmp_path_factory):
    isa, form = request.param
    return library.load(compile_library(isa, tmp_path_factory.mktemp("cpu-kernels"), form=form))


def random_blocks(qtype: str, N: int, K: int, seed: int, *, full_range: bool = False) -> KernelBlocks:
    """Random GGUF rows of ``qtype`` (random bytes) decoded to the kernel form. fp16 fields:
    ``full_range``: any finite bit pattern (every exponent, subnormals, +-65504); else a random
    sign times 1e-3..1e-1 (outputs of one magnitude, for the GEMM tolerances)."""
    t = GGUF_BLOCK_TYPES[qtype]
    rng = np.random.default_rng(seed)
    nb = K // t.block_size
    b = rng.integers(0, 256, (N, nb, t.block_bytes), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        if full_range:
            bits = rng.integers(0, 1 << 16, (N, nb), dtype=np.uint16)
            h = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16).view(np.float16)
        else:
            h = (rng.uniform(1e-3, 1e-1, (N, nb)) * rng.choice([-1.0, 1.0], (N, nb))).astype(np.float16)
        b[..., at : at + 2] = h.view(np.uint8).reshape(N, nb, 2)
    return decode_blocks(b.reshape(N, -1), qtype)


@pytest.mark.parametrize("qtype", list(GGUF_BLOCK_TYPES))
def test_i8_layout_dequantizes_bit_exactly_as_the_kernel_form(qtype):
    kb = random_blocks(qtype, 32, 512, seed=len(qtype) * 7 + list(GGUF_BLOCK_TYPES).index(qtype), full_range=True)
    w = layout.tile_i8(kb)
    want = dequantize_kernel_form(kb)
    np.testing.assert_array_equal(layout.dequantize(w).view(np.uint32), want.view(np.uint32))
    G, t = kb.group_size, GGUF_BLOCK_TYPES[qtype]
    assert (w.group, w.offset is None) == (G, not t.has_offset)
    # by hand: row 17 (tile 1, row 1), k = 301 (4-group 75, byte 1): code + 128 at [tile][75][row][1]
    assert int(w.codes[((1 * 128 + 75) * 16 + 1) * 4 + 1]) == int(kb.codes[17, 301]) + 128
    assert w.scale[(1 * (512 // G) + 301 // G) * 16 + 1] == kb.scales[17, 301 // G]
    bytes_per_weight = w.nbytes / (w.N * w.K)
    assert bytes_per_weight == 1 + (4 + 4 * t.has_offset) / G  # 1.125, 1.25 (offsets) or 1.25 (G = 16)


@pytest.mark.parametrize("M", [1, 3, 16, 33])
@pytest.mark.parametrize("qtype", GEMM_TYPES)
def test_i8_gemm_matches_the_integer_reference_and_the_float_product(lib, qtype, M):
    """Tolerances, of the largest |output|: 2e-6 against the float64 emulation of the same
    integer dots and scaling (fp32 rounding of the sums; measured <= 4e-7); against the float
    product x @ W^T 1e-4 with two activation levels and 2e-2 with one (measured <= 2.7e-5 and
    <= 7.7e-3 on this host's avx2 build): the Q4 / Q8 kinds' bounds."""
    kb = random_blocks(qtype, 48, 512, seed=100 + M)
    w = layout.tile_i8(kb)
    x = np.random.default_rng(M).standard_normal((M, 512)).astype(np.float32)
    x[0, 64:96] = 0.0  # an all-zero activation block: scale 0, codes 0
    exact = x.astype(np.float64) @ dequantize_kernel_form(kb).astype(np.float64).T
    scale = np.abs(exact).max()
    for levels, tol in ((2, 1e-4), (1, 2e-2)):
        y = library.gemm(lib, w, x, levels)
        emulated = reference.gemm_i8_from_quantized(
            reference.quantize_activations(x, levels, library.act_form(lib)), kb
        )
        np.testing.assert_allclose(y, emulated, rtol=0, atol=2e-6 * scale)
        assert np.abs(y - exact).max() / scale < tol


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_0", "Q6_K"])  # offsets; symmetric G = 32; G = 16
def test_an_i8_rows_gemm_bytes_do_not_depend_on_M_its_group_or_the_threads(lib, qtype):
    """Batch invariance (gemm.c): each row alone (M = 1) equals, bit for bit, the same row in
    M = 2..21 (every row-group split of both ISAs' kernels), with one thread or two."""
    w = layout.tile_i8(random_blocks(qtype, 32, 256, seed=6))
    rows = 21
    x = np.random.default_rng(7).standard_normal((rows, 256)).astype(np.float32)
    threads = lib.tp_get_threads()
    try:
        for levels in (1, 2):
            lib.tp_set_threads(1)
            alone = np.concatenate([library.gemm(lib, w, x[i : i + 1], levels) for i in range(rows)])
            for n_threads in (1, 2):
                lib.tp_set_threads(n_threads)
                for M in (2, 3, 5, 8, 9, 13, 16, 17, 21):
                    got = library.gemm(lib, w, x[:M], levels)
                    assert got.tobytes() == alone[:M].tobytes(), (levels, n_threads, M)
    finally:
        lib.tp_set_threads(threads)


@pytest.mark.parametrize("levels", [1, 2])
def test_quant_act_halves_adds_the_per_16_sums_and_changes_nothing_else(lib, levels):
    x = np.random.default_rng(9).standard_normal((5, 96)).astype(np.float32)
    plain, halves = library.quant_act(lib, x, levels), library.quant_act(lib, x, levels, halves=True)
    want = reference.quantize_activations(x, levels, library.act_form(lib))
    for k in ("q1", "q16", "s1", "asum", "qsum1") + (("q2", "s2", "qsum2") if levels == 2 else ()):
        np.testing.assert_array_equal(getattr(halves, k), getattr(plain, k), err_msg=k)
    np.testing.assert_array_equal(halves.qhalf1, want["qhalf1"])
    np.testing.assert_array_equal(halves.qhalf1.reshape(5, 3, 2).sum(2), plain.qsum1)
    if levels == 2 and library.act_form(lib) == "int8x2":  # the int16 form has one level
        np.testing.assert_array_equal(halves.qhalf2, want["qhalf2"])
    assert not plain.qhalf1.any()  # tp_quant_act leaves them alone


def test_q4_and_q8_as_i8_are_exact_and_give_the_same_gemm_bits(lib):
    """The conversion fused linears of mixed kinds use: the same dequantization bits, and the
    I8 kernel's output bit-identical to the Q4 / Q8 kernel's (the same integer dots, the same
    fp32 steps with d widened from fp16)."""
    rng = np.random.default_rng(10)
    N, K = 32, 128
    d = (rng.standard_normal((N, K // 32)) * 0.01).astype(np.float16).astype(np.float32)
    m = (rng.standard_normal((N, K // 32)) * 0.05).astype(np.float16).astype(np.float32)
    q8 = layout.tile_q8(rng.integers(0, 256, (N, K), dtype=np.uint8), d)
    q4 = layout.tile_q4(rng.integers(0, 16, (N, K), dtype=np.uint8), d, m)
    x = rng.standard_normal((5, K)).astype(np.float32)
    for w in (q8, q4):
        i8 = layout.to_i8(w)
        assert (i8.group, i8.offset is None) == (32, w.kind == "q8")
        np.testing.assert_array_equal(layout.dequantize(i8).view(np.uint32), layout.dequantize(w).view(np.uint32))
        for levels in (1, 2):
            assert library.gemm(lib, i8, x, levels).tobytes() == library.gemm(lib, w, x, levels).tobytes()


def test_fused_linears_of_mixed_kinds_are_exact_or_refused(lib):
    """QKV of Q5_0 + Q8 + Q6_K becomes one G = 16 I8 (the G = 32 scales repeated per half);
    gate/up of Q4_K + Q8_0 one G = 32 I8 with offsets (-0.0 for the Q8 rows); an offset weight
    beside a G = 16 one is refused, naming the fix."""
    q5, q6, qk, q80 = (
        random_blocks(t, 16 * (i + 1), 256, seed=20 + i) for i, t in enumerate(["Q5_0", "Q6_K", "Q4_K", "Q8_0"])
    )
    d = np.full((16, 8), 0.5, np.float32)
    q8 = layout.tile_q8(np.random.default_rng(1).integers(0, 256, (16, 256), dtype=np.uint8), d)
    qkv = layout.concat_rows("qkv", [layout.tile_i8(q5), q8, layout.tile_i8(q6)])
    assert (qkv.kind, qkv.group, qkv.offset, qkv.N) == ("i8", 16, None, 16 + 16 + 32)
    want = np.concatenate([dequantize_kernel_form(q5), layout.dequantize(q8), dequantize_kernel_form(q6)])
    np.testing.assert_array_equal(layout.dequantize(qkv).view(np.uint32), want.view(np.uint32))
    gate_up = layout.concat_rows("gate_up", [layout.tile_i8(qk), layout.tile_i8(q80)])
    assert (gate_up.group, gate_up.offset is not None) == (32, True)
    want = np.concatenate([dequantize_kernel_form(qk), dequantize_kernel_form(q80)])
    np.testing.assert_array_equal(layout.dequantize(gate_up).view(np.uint32), want.view(np.uint32))
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    y = library.gemm(lib, qkv, x, 2)
    parts = [library.gemm(lib, layout.tile_i8(q5), x, 2), library.gemm(lib, q8, x, 2)]
    # G = 32 rows run at G = 16 scale each half's dots apart (two fp32 roundings for one): close,
    # not the same bits; the Q6_K rows are the same weight and the same arithmetic: the same bits
    separate = np.concatenate(parts, axis=1)
    np.testing.assert_allclose(y[:, :32], separate, rtol=0, atol=2e-6 * np.abs(separate).max())
    assert y[:, 32:].tobytes() == library.gemm(lib, layout.tile_i8(q6), x, 2).tobytes()
    with pytest.raises(OpError, match=r"group-16 weight .* beside one with offsets.*Fix: keep these linears"):
        layout.concat_rows("qkv", [layout.tile_i8(qk), layout.tile_i8(q6)])


def test_the_i8_layout_refuses_what_the_kernels_cannot_take():
    kb = random_blocks("Q6_K", 16, 256, seed=3)
    with pytest.raises(OpError, match="group 16 with offsets other than -0.0"):
        layout.tile_i8(KernelBlocks("Q6_K", 16, kb.codes, kb.scales, np.zeros_like(kb.offsets)))
    with pytest.raises(OpError, match="N % 16 == 0"):
        layout.tile_i8(KernelBlocks("Q8_0", 32, kb.codes[:8], kb.scales[:8, ::2], kb.offsets[:8, ::2]))
    with pytest.raises(OpError, match="group_size = 64"):
        layout.tile_i8(KernelBlocks("Q8_0", 64, kb.codes, kb.scales[:, ::4], kb.offsets[:, ::4]))


@pytest.mark.slow  # one whole-library compile, ~35 s on the 2 shared Zen 3 cores
def test_the_avx512_variant_compiles(tmp_path):
    """This Zen 3 host cannot run avx512_vnni; the build proves the I8 instantiations of its
    wide and pairs kernels compile (their code is the Q8 path's, ISA macros only)."""
    assert compile_library("avx512_vnni", tmp_path).stat().st_size > 0
