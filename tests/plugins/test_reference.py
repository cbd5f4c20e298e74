"""Tests of the NumPy references that define trtpipe's custom ops (plugins/ops/paged_attention/reference.py).

PagedAttention is checked against a naive per-token, per-head loop over dense K/V histories
(independent of block tables), plus exact "which keys are visible" checks with one-hot values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtpipe.plugins.core import rope as RoPE
from trtpipe.plugins.core.errors import OpError, TrtpipeError
from trtpipe.plugins.ops.int4_gemm import reference as I4
from trtpipe.plugins.ops.paged_attention import reference as PA

# ----------------------------------------------------------------------------------------------
# PagedAttention helpers
# ----------------------------------------------------------------------------------------------


def _naive_attention(q, k_hist, v_hist, positions, H, KVH, scale, W):
    """q [n, H, D]; k_hist/v_hist [ctx, KVH, D]; loop over tokens and heads."""
    n, _, D = q.shape
    out = np.zeros((n, H, D), dtype=np.float64)
    for i in range(n):
        p = positions[i]
        for h in range(H):
            kv = h // (H // KVH)
            js = [j for j in range(k_hist.shape[0]) if j <= p and (W == 0 or j > p - W)]
            s = np.array([float(q[i, h] @ k_hist[j, kv]) * scale for j in js])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i, h] = sum(wj * v_hist[j, kv] for wj, j in zip(w, js))
    return out


class _Batch:
    """A packed step: sequences with histories already in the pool plus new chunk tokens."""

    def __init__(self, rng, *, H, KVH, D, BS, NB, MB, chunks, dtype=np.float32, W=0):
        # chunks: list of (num_cached, num_new) per sequence
        self.H, self.KVH, self.D, self.BS, self.W = H, KVH, D, BS, W
        self.key_cache = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)  # garbage, head-major
        self.value_cache = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)
        free = list(rng.permutation(np.arange(1, NB)))  # block 0 = null block
        S = len(chunks)
        self.block_tables = np.zeros((S, MB), dtype=np.int64)
        self.context_lens = np.zeros(S, dtype=np.int64)
        self.qsl = np.zeros(S + 1, dtype=np.int64)
        self.k_hist, self.v_hist, self.positions = [], [], []
        q, k, v, slots = [], [], [], []
        for s, (cached, new) in enumerate(chunks):
            ctx = cached + new
            nblocks = -(-ctx // BS)
            self.block_tables[s, :nblocks] = [free.pop() for _ in range(nblocks)]
            self.context_lens[s] = ctx
            self.qsl[s + 1] = self.qsl[s] + new
            kh = rng.standard_normal((ctx, KVH, D)).astype(dtype)
            vh = rng.standard_normal((ctx, KVH, D)).astype(dtype)
            for j in range(ctx):
                slot = self.block_tables[s, j // BS] * BS + j % BS
                if j < cached:  # history already in the pool
                    self.key_cache[:, slot // BS, slot % BS] = kh[j]
                    self.value_cache[:, slot // BS, slot % BS] = vh[j]
                else:
                    slots.append(slot)
                    k.append(kh[j].reshape(-1))
                    v.append(vh[j].reshape(-1))
            q.append(rng.standard_normal((new, H * D)).astype(dtype))
            self.k_hist.append(kh)
            self.v_hist.append(vh)
            self.positions.append(np.arange(cached, ctx))
        self.query = np.concatenate(q).astype(dtype)
        self.key = np.array(k, dtype=dtype).reshape(-1, KVH * D)
        self.value = np.array(v, dtype=dtype).reshape(-1, KVH * D)
        self.slot_mapping = np.array(slots, dtype=np.int64)

    def args(self):
        return (
            self.query,
            self.key,
            self.value,
            self.key_cache,
            self.value_cache,
            self.slot_mapping,
            self.block_tables,
            self.context_lens,
            self.qsl,
        )

    def kwargs(self, **over):
        kw = dict(num_heads=self.H, num_kv_heads=self.KVH, head_size=self.D, block_size=self.BS, sliding_window=self.W)
        kw.update(over)
        return kw

    def run(self, **over):
        return PA.paged_attention(*self.args(), **self.kwargs(**over))

    def expected(self, scale=None):
        scale = scale or 1 / math.sqrt(self.D)
        outs = []
        for s in range(len(self.k_hist)):
            a, b = self.qsl[s], self.qsl[s + 1]
            q = self.query[a:b].astype(np.float64).reshape(-1, self.H, self.D)
            outs.append(
                _naive_attention(
                    q,
                    self.k_hist[s].astype(np.float64),
                    self.v_hist[s].astype(np.float64),
                    self.positions[s],
                    self.H,
                    self.KVH,
                    scale,
                    self.W,
                )
            )
        return np.concatenate(outs).reshape(-1, self.H * self.D)


# ----------------------------------------------------------------------------------------------
# PagedAttention
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("W", [0, 1, 3, 5, 100])
def test_paged_attention_matches_naive_ragged_gqa(W):
    rng = np.random.default_rng(W)
    # prefill from 0, chunked prefill starting mid-block, decode, an empty sequence, one at a block edge
    b = _Batch(rng, H=4, KVH=2, D=8, BS=4, NB=24, MB=6, chunks=[(0, 7), (5, 6), (10, 1), (3, 0), (8, 1)], W=W)
    out, kc, vc = b.run()
    assert out.dtype == np.float32 and out.shape == (b.query.shape[0], 4 * 8)
    np.testing.assert_allclose(out, b.expected(), rtol=1e-5, atol=1e-5)


def test_paged_attention_writes_copies_and_never_mutates_inputs():
    """Head-major pool: kv head h of the token at slot s is ``cache[h, s // BS, s % BS]``."""
    rng = np.random.default_rng(1)
    b = _Batch(rng, H=4, KVH=2, D=4, BS=2, NB=10, MB=4, chunks=[(2, 3), (0, 1)])
    kc_in, vc_in = b.key_cache.copy(), b.value_cache.copy()
    _, kc, vc = b.run()
    np.testing.assert_array_equal(b.key_cache, kc_in)
    np.testing.assert_array_equal(b.value_cache, vc_in)
    for t, slot in enumerate(b.slot_mapping):
        for h in range(2):  # key row t = [head 0's D values, head 1's D values]
            np.testing.assert_array_equal(kc[h, slot // 2, slot % 2], b.key[t, h * 4 : (h + 1) * 4])
            np.testing.assert_array_equal(vc[h, slot // 2, slot % 2], b.value[t, h * 4 : (h + 1) * 4])
    untouched = np.ones(10 * 2, bool)
    untouched[b.slot_mapping] = False
    np.testing.assert_array_equal(kc.reshape(2, 20, -1)[:, untouched], kc_in.reshape(2, 20, -1)[:, untouched])


def test_paged_attention_explicit_scale_and_mha():
    rng = np.random.default_rng(2)
    b = _Batch(rng, H=3, KVH=3, D=4, BS=4, NB=8, MB=3, chunks=[(1, 4)])
    out, _, _ = b.run(scale=0.7)
    np.testing.assert_allclose(out, b.expected(scale=0.7), rtol=1e-5, atol=1e-5)


def test_paged_attention_float16_io_float32_math():
    rng = np.random.default_rng(3)
    b = _Batch(rng, H=4, KVH=1, D=8, BS=4, NB=12, MB=4, chunks=[(6, 3), (0, 2)], dtype=np.float16, W=4)
    out, kc, vc = b.run()
    assert out.dtype == np.float16 and kc.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), b.expected(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("W", [0, 1, 2, 4])
def test_sliding_window_visibility_exact(W):
    """One-hot values: output[t] is exactly the attention distribution over key positions, so
    its support must be {j : p-W < j <= p}, uniform because all scores are equal (query = 0)."""
    ctx, n, BS = 6, 3, 2
    D = ctx  # value of key j = e_j
    first = ctx - n
    q = np.zeros((n, D), np.float32)
    k_all = np.zeros((ctx, 1, D), np.float32)
    v_all = np.eye(ctx, dtype=np.float32)[:, None, :]
    bt = np.array([[3, 1, 2]], np.int64)
    kc = np.zeros((1, 4, BS, D), np.float32)
    vc = np.zeros((1, 4, BS, D), np.float32)
    slots = np.array([bt[0, j // BS] * BS + j % BS for j in range(ctx)])
    for j in range(first):
        vc[:, slots[j] // BS, slots[j] % BS] = v_all[j]
    out, _, _ = PA.paged_attention(
        q,
        k_all[first:].reshape(n, D),
        v_all[first:].reshape(n, D),
        kc,
        vc,
        slots[first:],
        bt,
        np.array([ctx]),
        np.array([0, n]),
        num_heads=1,
        num_kv_heads=1,
        head_size=D,
        block_size=BS,
        sliding_window=W,
    )
    for i in range(n):
        p = first + i
        visible = [j for j in range(ctx) if j <= p and (W == 0 or j > p - W)]
        expected = np.zeros(ctx, np.float32)
        expected[visible] = 1.0 / len(visible)
        np.testing.assert_allclose(out[i], expected, rtol=1e-6, atol=1e-7)


def test_sliding_window_ignores_unneeded_block_table_entries():
    """Blocks wholly outside every query's window may be freed (table entry -1 or garbage)."""
    rng = np.random.default_rng(4)
    b = _Batch(rng, H=2, KVH=1, D=4, BS=2, NB=12, MB=5, chunks=[(8, 1)], W=3)
    ref, _, _ = b.run()
    b.block_tables[0, :3] = [-1, 999, 0]  # keys 0..5 invisible to p=8 with W=3 (sees 6..8)
    out, _, _ = b.run()
    np.testing.assert_array_equal(out, ref)
    b.block_tables[0, 3] = 999  # key 6 is needed
    with pytest.raises(OpError, match=r"block_tables\[0, 3\]=999"):
        b.run()


def test_paged_attention_errors():
    rng = np.random.default_rng(5)
    b = _Batch(rng, H=4, KVH=2, D=4, BS=4, NB=8, MB=3, chunks=[(2, 3), (0, 2)])
    args = list(b.args())

    def run(i=None, val=None, **kw):
        a = list(args)
        if i is not None:
            a[i] = val
        return PA.paged_attention(*a, **b.kwargs(**kw))

    with pytest.raises(OpError, match="query"):
        run(0, b.query[:, :-1])
    with pytest.raises(OpError, match="key"):
        run(1, b.key[:-1])
    with pytest.raises(OpError, match="key_cache"):
        run(3, b.key_cache[:, :, :2])  # block_size 2, not 4
    with pytest.raises(OpError, match=r"key_cache.*\[num_kv_heads, NB, block_size, head_size\]"):
        run(3, b.key_cache.transpose(1, 0, 2, 3))  # the old [NB, ..] order: 8 is not KVH 2
    with pytest.raises(OpError, match="value_cache"):
        run(4, b.value_cache[:-1])
    with pytest.raises(OpError, match="dtype"):
        run(5, b.slot_mapping.astype(np.float32))
    with pytest.raises(OpError, match="num_kv_heads"):
        run(num_kv_heads=3)
    with pytest.raises(OpError, match="sliding_window"):
        run(sliding_window=-1)
    with pytest.raises(OpError, match="query_start_loc"):
        run(8, np.array([0, 3, 4]))
    with pytest.raises(OpError, match="context_lens"):
        run(7, np.array([5]))
    # context shorter than the chunk -> negative first position
    with pytest.raises(OpError, match=r"context_lens\[1\]=1 .*position would be -1"):
        run(7, np.array([5, 1]))
    # context longer than the block table covers
    with pytest.raises(OpError, match="MB=3"):
        run(7, np.array([13, 2]))
    with pytest.raises(OpError, match=r"slot_mapping\[0\]=-1"):
        sm = b.slot_mapping.copy()
        sm[0] = -1
        run(5, sm)
    with pytest.raises(OpError, match=r"slot_mapping\[1\]=.*position 3"):
        sm = b.slot_mapping.copy()
        sm[1] = sm[0]
        run(5, sm)
    bt = b.block_tables.copy()
    bt[1, 0] = 8  # NB = 8
    with pytest.raises(OpError, match=r"block_tables\[1, 0\]=8"):
        run(6, bt)
    assert issubclass(OpError, TrtpipeError)


# ----------------------------------------------------------------------------------------------
# Int4Gemm
# ----------------------------------------------------------------------------------------------


def _pack_pairs(codes, G):
    N, K = codes.shape
    c = codes.reshape(N, K // G, G // 2, 2).astype(np.uint8)
    return c[..., 0] | (c[..., 1] << 4)


def test_int4_gemm_by_hand():
    K, N, G = 32, 2, 16
    codes = np.arange(N * K).reshape(N, K) % 16
    b = _pack_pairs(codes, G)
    assert b[0, 0, 0] == 0x10 and b[0, 0, 1] == 0x32  # code 0 low, code 1 high
    scales = np.array([[0.5, 2.0], [1.0, -1.0]], np.float32)
    w = np.empty((N, K), np.float32)
    for n in range(N):
        for k in range(K):
            w[n, k] = (codes[n, k] - 8) * scales[n, k // G]
    np.testing.assert_array_equal(I4.dequantize_int4(b, scales, None, K, N, G), w)
    a = np.random.default_rng(0).standard_normal((3, K)).astype(np.float32)
    np.testing.assert_allclose(I4.int4_gemm(a, b, scales, K=K, N=N, group_size=G), a @ w.T, rtol=1e-6)
    # uint8 zero points: block 0 -> low nibble, block 1 -> high nibble
    zp = np.array([[0xF0], [0x03]], np.uint8)
    wz = np.empty((N, K), np.float32)
    zpv = [[0, 15], [3, 0]]
    for n in range(N):
        for k in range(K):
            wz[n, k] = (codes[n, k] - zpv[n][k // G]) * scales[n, k // G]
    np.testing.assert_array_equal(I4.dequantize_int4(b, scales, zp, K, N, G), wz)
    # float zero points
    zf = np.array([[0.5, -1.25], [7.0, 15.5]], np.float32)
    wf = (codes.reshape(N, 2, G) - zf[..., None]) * scales[..., None]
    np.testing.assert_array_equal(I4.dequantize_int4(b, scales, zf, K, N, G), wf.reshape(N, K))


def test_int4_gemm_batched_and_float16():
    rng = np.random.default_rng(1)
    K, N, G = 64, 5, 32
    b = rng.integers(0, 256, (N, K // G, G // 2), dtype=np.uint8)
    scales = rng.random((N, K // G)).astype(np.float16)
    a = rng.standard_normal((2, 3, K)).astype(np.float16)
    y = I4.int4_gemm(a, b, scales, K=K, N=N, group_size=G)
    assert y.shape == (2, 3, N) and y.dtype == np.float16
    w = I4.dequantize_int4(b, scales, None, K, N, G)
    np.testing.assert_allclose(y.astype(np.float32), a.astype(np.float32) @ w.T, rtol=2e-3, atol=2e-2)


def test_int4_gemm_errors():
    b = np.zeros((2, 3, 16), np.uint8)
    s = np.ones((2, 3), np.float32)
    a = np.ones((1, 96), np.float32)
    with pytest.raises(OpError, match=r"K=96 is not a multiple of group_size=64.*\[16, 32\]"):
        I4.int4_gemm(a, b, s, K=96, N=2, group_size=64)
    with pytest.raises(OpError, match="power of two"):
        I4.int4_gemm(a, b, s, K=96, N=2, group_size=24)
    with pytest.raises(OpError, match="bits=8"):
        I4.int4_gemm(a, b, s, K=96, N=2, group_size=32, bits=8)
    with pytest.raises(OpError, match="A"):
        I4.int4_gemm(a[:, :64], b, s, K=96, N=2, group_size=32)
    with pytest.raises(OpError, match="scales"):
        I4.int4_gemm(a, b, s[:, :2], K=96, N=2, group_size=32)
    with pytest.raises(OpError, match="b_packed"):
        I4.int4_gemm(a, b[:1], s, K=96, N=2, group_size=32)
    with pytest.raises(OpError, match="zero_points"):
        I4.int4_gemm(a, b, s, np.zeros((2, 1), np.uint8), K=96, N=2, group_size=32)
    with pytest.raises(OpError, match="zero_points"):
        I4.int4_gemm(a, b, s, np.zeros((2, 3), np.float16), K=96, N=2, group_size=32)


# ----------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------


def test_rope_default_layout_by_hand():
    cos, sin = RoPE.rope_cos_sin(5, 4, 10000.0)
    assert cos.shape == sin.shape == (5, 4) and cos.dtype == np.float32
    inv = np.array([1.0, 0.01])
    for p in range(5):
        np.testing.assert_allclose(cos[p], np.cos(p * np.r_[inv, inv]), rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(sin[p], np.sin(p * np.r_[inv, inv]), rtol=1e-7, atol=1e-7)
    c64, _ = RoPE.rope_cos_sin(3, 4, 10000.0, dtype=np.float64)
    assert c64.dtype == np.float64


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0}, LLAMA3])
def test_rope_matches_transformers(scaling):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    head_dim, theta = 64, 500000.0
    rope = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        rope.update(scaling)
    cfg = transformers.LlamaConfig(
        hidden_size=128, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=16384, rope_parameters=rope
    )
    emb = LlamaRotaryEmbedding(cfg)
    ours = RoPE.rope_inv_freq(head_dim, theta, scaling)
    np.testing.assert_allclose(ours, emb.inv_freq.double().numpy(), rtol=1e-6)  # HF is float32
    pos = torch.arange(64)[None]
    cos_hf, sin_hf = emb(torch.zeros(1, dtype=torch.float32), pos)
    cos, sin = RoPE.rope_cos_sin(64, head_dim, theta, scaling)
    np.testing.assert_allclose(cos, cos_hf[0].numpy(), atol=2e-5)
    np.testing.assert_allclose(sin, sin_hf[0].numpy(), atol=2e-5)


def test_rope_llama3_bands():
    inv = RoPE.rope_inv_freq(128, 500000.0)
    ours = RoPE.rope_inv_freq(128, 500000.0, LLAMA3)
    wavelen = 2 * math.pi / inv
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    np.testing.assert_array_equal(ours[high], inv[high])
    np.testing.assert_allclose(ours[low], inv[low] / 8.0, rtol=1e-15)
    mid = ~high & ~low
    assert mid.any() and np.all(ours[mid] < inv[mid]) and np.all(ours[mid] > inv[mid] / 8)


def test_rope_errors():
    with pytest.raises(OpError, match="yarn"):
        RoPE.rope_cos_sin(4, 8, 1e4, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(OpError, match="factor"):
        RoPE.rope_cos_sin(4, 8, 1e4, {"rope_type": "linear"})
    with pytest.raises(OpError, match="even"):
        RoPE.rope_cos_sin(4, 7, 1e4)
    assert np.array_equal(RoPE.rope_inv_freq(8, 1e4, {"type": "linear", "factor": 2.0}), RoPE.rope_inv_freq(8, 1e4) / 2)


def test_check_positions_never_wraps():
    np.testing.assert_array_equal(RoPE.check_positions(np.array([0, 5, 9]), 10), [0, 5, 9])
    with pytest.raises(OpError, match=r"positions\[2\]=10 .*\[0, 10\)"):
        RoPE.check_positions(np.array([0, 5, 10]), 10)
    with pytest.raises(OpError, match=r"positions\[1\]=-1"):
        RoPE.check_positions(np.array([0, -1]), 10)
    with pytest.raises(OpError, match=r"positions\[\(1, 0\)\]"):
        RoPE.check_positions(np.array([[0], [11]]), 10)
    with pytest.raises(OpError, match="dtype"):
        RoPE.check_positions(np.array([0.0]), 10)


def test_apply_rotary_matches_rotate_half_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    cos, sin = RoPE.rope_cos_sin(10, 8, 100.0)
    pos = np.array([0, 4, 9])
    y = RoPE.apply_rotary(x, cos[pos], sin[pos])
    np.testing.assert_array_equal(y[0], x[0])  # position 0 is the identity
    # pairs (i, i + D/2) rotate by angle p * inv_freq[i]
    inv = RoPE.rope_inv_freq(8, 100.0)
    for t, p in enumerate(pos):
        for i in range(4):
            c, s = math.cos(p * inv[i]), math.sin(p * inv[i])
            np.testing.assert_allclose(y[t, :, i], x[t, :, i] * c - x[t, :, i + 4] * s, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y[t, :, i + 4], x[t, :, i + 4] * c + x[t, :, i] * s, rtol=1e-5, atol=1e-6)
