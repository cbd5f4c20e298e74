"""The kernel form of GGUF blocks (plugins/core/gguf_blocks) against gguf-py's own
``gguf.quants.dequantize``, bit for bit (float32 bit patterns compared as uint32), on random
blocks: random code bytes, random finite fp16 scales of every magnitude and sign (subnormal,
zero, 65504), random 6-bit k-quant scales and mins in every sub-block; and on the real Gemma 3
270M Q4_K_M file when it is present."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks import (
    GGUF_BLOCK_TYPES,
    decode_blocks,
    dequantize_blocks,
    dequantize_kernel_form,
    gguf_nbytes,
)
from trtpipe.plugins.core.gguf_blocks.kquants import k_scale_min

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

GEMMA = Path("/work/models/gemma-3-270m-q4_k_m.gguf")
FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,)}
FP16_AT |= {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
EDGE_FP16 = np.array([0.0, -0.0, 65504.0, -65504.0, 2.0**-24, -(2.0**-24), 2.0**-14, 1.0], np.float16)


def _finite_fp16(rng, shape) -> np.ndarray:
    """Random fp16 bit patterns (every exponent, both signs), the inf/NaN exponent mapped to a
    finite one, with the edge values planted at the start."""
    bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)
    flat = bits.reshape(-1)
    flat[: len(EDGE_FP16)] = EDGE_FP16.view(np.uint16)
    return flat.reshape(shape)


def _random_rows(qtype: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """uint8 [rows, blocks_per_row * block_bytes]: random bytes, fp16 fields finite."""
    t = GGUF_BLOCK_TYPES[qtype]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, blocks_per_row, t.block_bytes), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        b[..., at : at + 2] = _finite_fp16(rng, (rows, blocks_per_row)).view(np.uint8).reshape(rows, blocks_per_row, 2)
    return b.reshape(rows, -1)


def _assert_bits_equal(mine: np.ndarray, ref: np.ndarray) -> None:
    assert mine.dtype == np.float32 and ref.dtype == np.float32 and mine.shape == ref.shape
    np.testing.assert_array_equal(mine.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", list(GGUF_BLOCK_TYPES))
def test_kernel_form_is_bit_exact_with_gguf_on_random_blocks(qtype):
    t = GGUF_BLOCK_TYPES[qtype]
    nb = 4 if t.block_size == 256 else 8
    raw = _random_rows(qtype, rows=24, blocks_per_row=nb, seed=list(GGUF_BLOCK_TYPES).index(qtype))
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert np.all(np.isfinite(ref)) and np.count_nonzero(ref) > ref.size // 2
    kb = decode_blocks(raw, qtype)
    K = nb * t.block_size
    assert (kb.qtype, kb.group_size, kb.N, kb.K) == (qtype, t.group_size, 24, K)
    assert kb.codes.dtype == np.int8 and kb.codes.shape == (24, K)
    assert kb.scales.dtype == kb.offsets.dtype == np.float32
    assert kb.scales.shape == kb.offsets.shape == (24, K // t.group_size)
    # the documented code range, reached at both ends by random bytes
    assert (int(kb.codes.min()), int(kb.codes.max())) == (t.code_min, t.code_max)
    if not t.has_offset:
        assert np.all(kb.offsets.view(np.uint32) == np.float32(-0.0).view(np.uint32))
    _assert_bits_equal(dequantize_kernel_form(kb), ref)
    _assert_bits_equal(dequantize_blocks(raw, qtype), ref)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0", "Q6_K"])
def test_negative_zero_offset_keeps_the_sign_of_zero(qtype):
    """Symmetric types: a negative scale times code 0 is -0.0 in gguf; the kernel's add of the
    -0.0 offset keeps it (an offset of +0.0 would turn it into +0.0)."""
    raw = _random_rows(qtype, rows=8, blocks_per_row=2, seed=7)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    neg_zero = ref.view(np.uint32) == np.uint32(0x80000000)
    assert neg_zero.any()
    kb = decode_blocks(raw, qtype)
    assert np.all(dequantize_kernel_form(kb).view(np.uint32)[neg_zero] == 0x80000000)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_split_scales_of_sub_blocks_4_to_7_are_random_and_exact(qtype):
    """The 6-bit scales and mins of sub-blocks 4-7 are stored split across bytes: the random
    blocks give them many values (so a wrong split changes outputs), and each sub-block's
    scale is d * sc_j with sc_j from gguf-py's own get_scale_min."""
    raw = _random_rows(qtype, rows=16, blocks_per_row=4, seed=11)
    blocks = raw.reshape(16, 4, -1)
    sc, m = k_scale_min(blocks[..., 4:16])
    ref_sc, ref_m = gguf.quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
    np.testing.assert_array_equal(sc.reshape(-1, 8), ref_sc)
    np.testing.assert_array_equal(m.reshape(-1, 8), ref_m)
    assert len(np.unique(sc[..., 4:])) > 40 and len(np.unique(m[..., 4:])) > 40
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    kb = decode_blocks(raw, qtype)
    expected = (d * sc.astype(np.float32)).reshape(16, -1)
    np.testing.assert_array_equal(kb.scales.view(np.uint32), expected.view(np.uint32))


def test_bytes_per_weight_per_type():
    """GGUF figures against gguf-py's GGML_QUANT_SIZES; kernel form 1 B code + 8 B per group."""
    for name, t in GGUF_BLOCK_TYPES.items():
        assert gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (t.block_size, t.block_bytes)
    got = {n: (t.gguf_bytes_per_weight, t.kernel_bytes_per_weight) for n, t in GGUF_BLOCK_TYPES.items()}
    assert got == {
        "Q4_0": (0.5625, 1.25),
        "Q4_1": (0.625, 1.25),
        "Q5_0": (0.6875, 1.25),
        "Q5_1": (0.75, 1.25),
        "Q8_0": (1.0625, 1.25),
        "Q4_K": (0.5625, 1.25),
        "Q5_K": (0.6875, 1.25),
        "Q6_K": (0.8203125, 1.5),
    }
    assert GGUF_BLOCK_TYPES["Q4_1"].packed_bytes_per_weight == 0.5 + 8 / 32
    assert GGUF_BLOCK_TYPES["Q6_K"].packed_bytes_per_weight == 0.75 + 4 / 16
    assert gguf_nbytes("Q6_K", (3, 512)) == 3 * 2 * 210 and gguf_nbytes("F32", (3, 5)) == 60
    with pytest.raises(ValueError, match="multiple of Q4_K's block of 256"):
        gguf_nbytes("Q4_K", (3, 640))


def test_bad_input_is_named():
    with pytest.raises(OpError, match=r"qtype = 'Q2_K' has no kernel-form decoder.*Fix:"):
        decode_blocks(np.zeros((2, 84), np.uint8), "Q2_K")
    with pytest.raises(OpError, match=r"row_bytes = 35 is not a multiple of Q8_0's block of 34"):
        decode_blocks(np.zeros((2, 35), np.uint8), "Q8_0")
    with pytest.raises(OpError, match=r"raw: float32 \(2, 34\), expected uint8"):
        decode_blocks(np.zeros((2, 34), np.float32), "Q8_0")


@pytest.mark.slow  # GGUFReader parses the 262k-token vocabulary (25-45 s on the 2 shared Zen 3 cores)
@pytest.mark.skipif(not GEMMA.is_file(), reason=f"{GEMMA} is not present (the Gemma 3 270M Q4_K_M file)")
def test_real_gemma_tensors_of_every_type_are_bit_exact():
    """The smallest tensor of each quantized type in the Gemma 3 270M Q4_K_M file."""
    reader = gguf.GGUFReader(str(GEMMA))
    smallest: dict[str, object] = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        if name in GGUF_BLOCK_TYPES and (name not in smallest or t.n_bytes < smallest[name].n_bytes):
            smallest[name] = t
    assert set(smallest) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    for name, t in smallest.items():
        raw = np.asarray(t.data)
        ref = gguf_dequantize(raw, t.tensor_type)
        assert np.count_nonzero(ref) > ref.size // 2, t.name
        _assert_bits_equal(dequantize_blocks(raw, name), ref)


def test_imports_and_decodes_without_gguf_or_torch():
    """The device side has NumPy but neither gguf nor torch: the folder must not need them."""
    code = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, n, p=None, t=None):\n"
        "        if n.split('.')[0] in ('gguf', 'torch'): raise ImportError(n)\n"
        "sys.meta_path.insert(0, B())\n"
        "import numpy as np\n"
        "from trtpipe.plugins.core.gguf_blocks import dequantize_blocks\n"
        "raw = np.zeros((1, 34), np.uint8); raw[0, :2] = np.array([0.5], np.float16).view(np.uint8); raw[0, 2] = 3\n"
        "print(dequantize_blocks(raw, 'Q8_0')[0, :2].tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[1.5, 0.0]"
