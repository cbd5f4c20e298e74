"""Tests of the Triton kernels (plugins/ops/paged_attention/triton_kernels.py, launched by plugins/ops/paged_attention/triton_launch.py) without a GPU.

Two halves:
- numerical tests (``interp_*``) run the kernels under ``TRITON_INTERPRET=1`` against
  plugins/ops/paged_attention/reference.py. The interpreter must be chosen before the kernels are decorated, so
  :func:`test_kernels_under_interpreter` reruns this file in a subprocess with the variable
  set, where the ``interp_*`` functions are collected as ``test_interp_*`` (and the AOT tests
  are skipped); the parent process does not collect them.
- AOT tests compile every kernel to cubin/PTX for sm_80 (A100), sm_87 (Orin), sm_90 (H200).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from trtpipe.plugins.core.errors import OpError  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import pack as P  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import reference as I4  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import triton_launch as TL4  # noqa: E402
from trtpipe.plugins.ops.paged_attention import reference as PA  # noqa: E402
from trtpipe.plugins.ops.paged_attention import tiles  # noqa: E402
from trtpipe.plugins.ops.paged_attention import triton_launch as TL  # noqa: E402
from trtpipe.plugins.triton import aot as TA  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
compiled = pytest.mark.skipif(INTERPRET, reason="AOT compilation needs JIT (non-interpreted) kernels")


@compiled
def test_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "test_interp_", __file__]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

POISON = 1  # physical block filled with NaN: reading it anywhere shows up as NaN in the output


def _batch(rng, *, H, KVH, D, BS, NB, MB, chunks, dtype=np.float32, W=0):
    """A packed step for the reference: per sequence (num_cached, num_new). Block 0 (null) and
    block POISON hold NaN; table padding points at 0, blocks wholly outside every query's window
    at POISON, so any read of an unneeded block poisons the output. Caches are head-major
    ``[KVH, NB, BS, D]``."""
    kc = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)
    vc = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)
    kc[:, [0, POISON]] = np.nan
    vc[:, [0, POISON]] = np.nan
    free = list(rng.permutation(np.arange(2, NB)))
    S = len(chunks)
    bt = np.zeros((S, MB), np.int64)
    cl = np.zeros(S, np.int64)
    qsl = np.zeros(S + 1, np.int64)
    slots = []
    for s, (cached, new) in enumerate(chunks):
        ctx = cached + new
        nblocks = -(-ctx // BS)
        bt[s, :nblocks] = [free.pop() for _ in range(nblocks)]
        if W and new:
            lo = max(0, cached - W + 1)  # first key any query of the chunk sees
            bt[s, : lo // BS] = POISON
        cl[s] = ctx
        qsl[s + 1] = qsl[s] + new
        slots += [int(bt[s, p // BS] * BS + p % BS) for p in range(cached, ctx)]
    T = int(qsl[-1])
    q = rng.standard_normal((T, H * D)).astype(dtype)
    k = rng.standard_normal((T, KVH * D)).astype(dtype)
    v = rng.standard_normal((T, KVH * D)).astype(dtype)
    args = (q, k, v, kc, vc, np.array(slots, np.int64).reshape(T), bt, cl, qsl)
    kw = dict(num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=W)
    return args, kw


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _run_both(args, kw, **launcher_kw):
    ref_out, ref_kc, ref_vc = PA.paged_attention(*args, **kw)
    targs = [_t(a) for a in args]
    out, kc, vc = TL.paged_attention(*targs, **kw, **launcher_kw)
    assert kc is targs[3] and vc is targs[4]  # in place
    np.testing.assert_array_equal(kc.numpy(), ref_kc)
    np.testing.assert_array_equal(vc.numpy(), ref_vc)
    return out.numpy(), ref_out


TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float16: dict(rtol=2e-3, atol=2e-3)}


# ----------------------------------------------------------------------------------------------
# PagedAttention under the interpreter
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("W", [0, 1, 3, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def interp_decode_matches_reference(W, dtype):
    rng = np.random.default_rng(W)
    # GQA group 3 (padded to 4), head 24 (padded to 32), contexts at and across block edges
    args, kw = _batch(
        rng, H=6, KVH=2, D=24, BS=4, NB=24, MB=5, chunks=[(0, 1), (3, 1), (4, 1), (11, 1), (19, 1)], dtype=dtype, W=W
    )
    out, ref = _run_both(args, kw, max_query_len=1)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), **TOL[dtype])


def interp_decode_small_key_tiles():
    rng = np.random.default_rng(7)
    args, kw = _batch(rng, H=4, KVH=1, D=16, BS=2, NB=20, MB=12, chunks=[(20, 1), (6, 1)], W=5)
    ref, _, _ = PA.paged_attention(*args, **kw)
    targs = [_t(a) for a in args]
    TL.write_kv_cache(targs[1], targs[2], targs[3], targs[4], targs[5])
    out = TL.paged_attention_decode(
        targs[0], targs[3], targs[4], targs[6], targs[7], block_n=16, **{k: v for k, v in kw.items()}
    )
    np.testing.assert_allclose(out.numpy(), ref, **TOL[np.float32])


@pytest.mark.parametrize("W", [0, 1, 3, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def interp_prefill_ragged_matches_reference(W, dtype):
    rng = np.random.default_rng(10 + W)
    # prefill from 0, chunked prefill mid-block, a single token, an empty sequence, two tokens
    chunks = [(0, 7), (5, 6), (10, 1), (3, 0), (8, 2)]
    args, kw = _batch(rng, H=4, KVH=2, D=16, BS=4, NB=32, MB=5, chunks=chunks, dtype=dtype, W=W)
    out, ref = _run_both(args, kw, max_query_len=7)  # default tiling: one tile per sequence
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), **TOL[dtype])
    # block_q=8 x group 2 = 16 rows: several tiles per sequence, tiles not aligned to qsl
    targs = [_t(a) for a in args]
    TL.write_kv_cache(targs[1], targs[2], targs[3], targs[4], targs[5])
    out = TL.paged_attention_prefill(
        targs[0], targs[3], targs[4], targs[6], targs[7], targs[8], block_q=8, block_n=16, **kw
    ).numpy()
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), **TOL[dtype])


@pytest.mark.parametrize("block_q,block_n", [(2, 16), (16, 32)])
def interp_prefill_tilings_mha_and_group8(block_q, block_n):
    rng = np.random.default_rng(block_q)
    for H, KVH in ((2, 2), (8, 1)):
        if block_q * tiles.next_pow2(H // KVH) < 16:
            continue
        args, kw = _batch(rng, H=H, KVH=KVH, D=16, BS=8, NB=16, MB=4, chunks=[(0, 19), (13, 5), (2, 3)], W=4)
        ref, _, _ = PA.paged_attention(*args, **kw)
        targs = [_t(a) for a in args]
        TL.write_kv_cache(targs[1], targs[2], targs[3], targs[4], targs[5])
        out = TL.paged_attention_prefill(
            targs[0], targs[3], targs[4], targs[6], targs[7], targs[8], block_q=block_q, block_n=block_n, **kw
        )
        np.testing.assert_allclose(out.numpy(), ref, **TOL[np.float32])


def _pool_tensor(codes: np.ndarray, kv_dtype: str):
    """A pool as the kernels take it: bf16 bit patterns (uint16) viewed as torch.bfloat16."""
    t = _t(codes.view(np.int16) if kv_dtype == "bf16" else codes)
    return t.view(torch.bfloat16) if kv_dtype == "bf16" else t


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def interp_kv_dtypes_match_reference(kv_dtype, mode):
    """fp32 queries over fp16 / bf16 / int8 pools (plugins/core/kv_codec.py) against the reference
    reading the same encoded pool: written codes and int8 scales bit for bit, the output within
    1e-5. An int8 pool's poisoned blocks carry NaN scales (its codes cannot hold NaN)."""
    from trtpipe.plugins.core.kv_codec import kv_encode

    rng = np.random.default_rng(17)
    chunks = [(0, 1), (3, 1), (11, 1), (19, 1)] if mode == "decode" else [(5, 7), (0, 9), (13, 1)]
    args, kw = _batch(rng, H=6, KVH=2, D=24, BS=4, NB=24, MB=6, chunks=chunks, W=3)
    q, k, v, kc, vc, *idx = args
    k[0, :24] = 0.0  # an all-zero int8 row: scale 0, codes 0
    pool = []
    for c in (kc, vc):
        codes, sc = kv_encode(np.nan_to_num(c) if kv_dtype == "int8" else c, kv_dtype)
        if sc is not None:
            sc[:, [0, POISON]] = np.nan
        pool.append((codes, sc))
    scales = [pool[0][1], pool[1][1]] if kv_dtype == "int8" else []
    want = PA.paged_attention(q, k, v, pool[0][0], pool[1][0], *idx, *scales, **kw)
    targs = [_t(x) for x in (q, k, v)] + [_pool_tensor(c, kv_dtype) for c, _ in pool] + [_t(x) for x in idx]
    got = TL.paged_attention(*targs, *(_t(x) for x in scales), **kw, max_query_len=1 if mode == "decode" else None)
    assert np.isfinite(got[0].numpy()).all()
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], want[1:], strict=True):
        g = (
            g.view(torch.int16).numpy().view(np.uint16)
            if kv_dtype == "bf16" and g.dtype == torch.bfloat16
            else g.numpy()
        )
        np.testing.assert_array_equal(g, w)


def interp_write_kv_cache_exact_and_skips_negative_slots():
    rng = np.random.default_rng(3)
    kc = torch.zeros((2, 4, 2, 4))  # [KVH, NB, BS, D]
    vc = torch.zeros((2, 4, 2, 4))
    key = torch.from_numpy(rng.standard_normal((3, 8)).astype(np.float32))
    value = torch.from_numpy(rng.standard_normal((3, 8)).astype(np.float32))
    TL.write_kv_cache(key, value, kc, vc, torch.tensor([5, -1, 0]))
    np.testing.assert_array_equal(kc[:, 2, 1].reshape(8).numpy(), key[0].numpy())
    np.testing.assert_array_equal(vc[:, 0, 0].reshape(8).numpy(), value[2].numpy())
    assert int((kc != 0).sum()) == 16  # the skipped token wrote nothing


def interp_write_kv_cache_head_major_by_hand():
    # KVH=2, NB=3, BS=2, D=4: token t's kv head h goes to cache[h, slot // 2, slot % 2], i.e. flat
    # element h * (NB*BS*D = 24) + slot * 4; every other element keeps its sentinel
    key = torch.arange(1, 17, dtype=torch.float32).reshape(2, 8)  # token 0: 1..8, token 1: 9..16
    value = -key
    kc = torch.full((2, 3, 2, 4), 100.0)
    vc = torch.full((2, 3, 2, 4), 100.0)
    TL.write_kv_cache(key, value, kc, vc, torch.tensor([3, 4]))  # token 0 -> block 1 pos 1, token 1 -> block 2 pos 0
    flat = kc.reshape(-1)
    assert flat[12:16].tolist() == [1, 2, 3, 4]  # head 0 of slot 3: 0 * 24 + 3 * 4
    assert flat[36:40].tolist() == [5, 6, 7, 8]  # head 1 of slot 3: 1 * 24 + 3 * 4
    assert flat[16:20].tolist() == [9, 10, 11, 12]  # head 0 of slot 4
    assert flat[40:44].tolist() == [13, 14, 15, 16]  # head 1 of slot 4
    assert kc[1, 1, 1].tolist() == [5, 6, 7, 8] and kc[0, 2, 0].tolist() == [9, 10, 11, 12]
    written = torch.zeros(48, dtype=torch.bool)
    for lo in (12, 16, 36, 40):
        written[lo : lo + 4] = True
    assert (flat[~written] == 100.0).all()  # nothing else changed
    vflat = vc.reshape(-1)
    assert torch.equal(vflat[written], -flat[written]) and (vflat[~written] == 100.0).all()


_D4_BS2 = dict(head_size=4, block_size=2)


def interp_launcher_errors():
    q = torch.zeros((2, 8))
    kc = torch.zeros((1, 4, 2, 4))  # [KVH=1, NB=4, BS=2, D=4]
    bt = torch.zeros((2, 2), dtype=torch.int64)
    cl = torch.ones(2, dtype=torch.int64)
    with pytest.raises(OpError, match="num_kv_heads"):
        TL.paged_attention_decode(q, kc, kc, bt, cl, num_heads=2, num_kv_heads=3, head_size=4, block_size=2)
    with pytest.raises(OpError, match="key_cache"):
        TL.paged_attention_decode(q, kc, kc, bt, cl, num_heads=2, num_kv_heads=1, head_size=4, block_size=4)
    old = torch.zeros((4, 2, 2, 4))  # the pre-format-2 token-major [NB, BS, KVH, D] pool
    with pytest.raises(OpError, match=r"key_cache: shape \(4, 2, 2, 4\), expected .* \[2, NB, 2, 4\]"):
        TL.paged_attention_decode(torch.zeros((2, 16)), old, old, bt, cl, num_heads=4, num_kv_heads=2, **_D4_BS2)
    strided = torch.zeros((1, 4, 2, 8))[..., :4]  # right shape [1, 4, 2, 4], not contiguous
    with pytest.raises(OpError, match=r"value_cache: .*not contiguous"):
        TL.paged_attention_decode(q, kc, strided, bt, cl, num_heads=2, num_kv_heads=1, **_D4_BS2)
    with pytest.raises(OpError, match="value_cache"):
        TL.write_kv_cache(torch.zeros((1, 4)), torch.zeros((1, 4)), kc, strided, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(OpError, match="K=48 is not a multiple"):
        TL4.int4_gemm(
            torch.zeros((1, 48)),
            torch.zeros((1, 1, 16), dtype=torch.uint8),
            torch.ones((1, 1)),
            K=48,
            N=1,
            group_size=32,
        )


# ----------------------------------------------------------------------------------------------
# Int4Gemm under the interpreter
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zp_kind", ["none", "uint8", "float"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def interp_int4_gemm_matches_reference(zp_kind, dtype):
    rng = np.random.default_rng(0)
    for M_shape, N, K, G in (((1,), 40, 128, 32), ((2, 3), 17, 256, 128), ((5,), 33, 64, 16)):
        w = rng.standard_normal((N, K)).astype(np.float32)
        packed, scales, zp = P.quantize_rtn(w, G, symmetric=zp_kind == "none")
        if zp_kind == "uint8":  # make sure the extreme zero points 0 and 15 occur
            z = P.unpack_zero_points_uint8(zp, N, K // G)
            z[0, 0], z[-1, -1] = 0, 15
            zp = P.pack_zero_points_uint8(z)
        elif zp_kind == "float":
            zp = (rng.standard_normal((N, K // G)) * 4 + 8).astype(dtype)
        scales = scales.astype(dtype)
        a = rng.standard_normal((*M_shape, K)).astype(dtype)
        ref = I4.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
        y = TL4.int4_gemm(_t(a), _t(packed), _t(scales), None if zp is None else _t(zp), K=K, N=N, group_size=G)
        assert y.shape == (*M_shape, N) and y.numpy().dtype == dtype
        scale = np.abs(ref.astype(np.float32)).max()
        err = np.abs(y.numpy().astype(np.float32) - ref.astype(np.float32)).max() / scale
        assert err < (1e-5 if dtype == np.float32 else 3e-3), (M_shape, N, K, G, err)


# ----------------------------------------------------------------------------------------------
# ahead-of-time compilation, no GPU
# ----------------------------------------------------------------------------------------------


@compiled
@pytest.mark.parametrize("cc", [80, 87, 90])
@pytest.mark.parametrize("name", sorted(TA.AOT_KERNELS))
def test_aot_compile_cubin_and_ptx(name, cc):
    k = TA.aot_compile(name, cc=cc)
    cubin, ptx = k.asm["cubin"], k.asm["ptx"]
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF" and len(cubin) > 1000
    assert f".target sm_{cc}" in ptx and f".entry {k.metadata.name}" in ptx


@compiled
def test_aot_compile_fp32_and_float_zero_points():
    k = TA.aot_compile("int4_gemm", cc=87, dtype="fp32", ZP_MODE=2, INPUT_PRECISION="ieee")
    assert len(k.asm["cubin"]) > 1000
    k = TA.aot_compile(
        "paged_attention_prefill",
        cc=80,
        dtype="fp32",
        INPUT_PRECISION="ieee",
        NUM_KV_HEADS=8,
        GROUP=4,
        GROUP_PAD=4,
        HEAD_SIZE=128,
        D_PAD=128,
        BLOCK_Q=16,
    )
    assert len(k.asm["cubin"]) > 1000
    with pytest.raises(OpError, match="unknown kernel"):
        TA.aot_compile("nope", cc=80)


if INTERPRET:  # collect the numerical tests only where the kernels run in the interpreter
    for _name, _fn in list(globals().items()):
        if _name.startswith("interp_") and callable(_fn):
            globals()["test_" + _name] = _fn
