"""The KV pool encodings (plugins/core/kv_codec.py) against hand-computed values, and the pool's
int8 scales (runtime/kv/pool.py)."""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.plugins.core.kv_codec import (
    bf16_bits,
    bf16_to_float32,
    kv_decode,
    kv_dtype_of_array,
    kv_encode,
    kv_head_token_bytes,
    kv_storage_dtype,
)
from trtpipe.runtime.artifact.manifest import KVLayout
from trtpipe.runtime.kv.pool import KVPool


def test_int8_rows_by_hand():
    x = np.array([[1.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    q, s = kv_encode(x, "int8")
    # amax 2: scale 2/127, q = rint(x * 63.5): 63.5 -> 64 (half to even), -127, 31.75 -> 32, 0
    assert q.tolist() == [[64, -127, 32, 0], [0, 0, 0, 0]]
    assert s.dtype == np.float32 and s.tolist() == [np.float32(2) / np.float32(127), 0.0]
    back = kv_decode(q, s, "int8")
    assert np.abs(back - x).max() <= s[0] / 2 + 1e-7  # half a step of the row's scale
    assert not back[1].any()


def test_bf16_rounds_to_nearest_even_and_fp16_is_ieee_half():
    one = np.float32(1.0).view(np.uint32)
    x = np.array([one + 0x8000, one + 0x18000, one + 0x7FFF], np.uint32).view(np.float32)  # ties and below
    assert bf16_bits(x).tolist() == [0x3F80, 0x3F82, 0x3F80]  # tie -> even (0x3F80), tie -> even (0x3F82)
    assert bf16_to_float32(np.array([0x3F80, 0xC000], np.uint16)).tolist() == [1.0, -2.0]
    codes, scale = kv_encode(np.array([0.1], np.float32), "fp16")
    assert codes.dtype == np.float16 and scale is None and codes[0] == np.float16(0.1)


def test_bytes_and_storage_per_dtype():
    assert [kv_head_token_bytes(d, 64) for d in ("fp32", "float16", "bf16", "int8")] == [256, 128, 128, 68]
    assert [kv_storage_dtype(d).name for d in ("fp32", "fp16", "bf16", "int8")] == [
        "float32",
        "float16",
        "uint16",
        "int8",
    ]
    assert kv_dtype_of_array(np.zeros(1, np.uint16)) == "bf16"
    with pytest.raises(ValueError, match="expected one of"):
        kv_head_token_bytes("fp8", 64)


def test_int8_pool_holds_scales_and_copies_them_with_blocks():
    pool = KVPool(KVLayout(4, 5, "int8", (2, 1), 8, 0))
    assert pool.keys[0].dtype == np.int8 and pool.keys[0].shape == (2, 5, 4, 8)
    assert [s.shape for s in pool.key_scales] == [(2, 5, 4), (1, 5, 4)]
    assert pool.nbytes == pool.layout.pool_bytes == 2 * 5 * 4 * (2 + 1) * (8 + 4)
    pool.keys[1][:, 2] = 7
    pool.value_scales[0][:, 2] = 0.5
    pool.copy_blocks([(2, 4)])
    assert (pool.keys[1][:, 4] == 7).all() and (pool.value_scales[0][:, 4] == 0.5).all()
    assert not pool.value_scales[0][:, 3].any()
    assert KVPool(KVLayout(4, 5, "bfloat16", (1,), 8, 0)).keys[0].dtype == np.uint16
