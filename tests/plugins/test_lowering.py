"""ONNX Runtime lowering and torch custom ops against the NumPy references / naive loops.

Each PagedAttention case is one ``trtpipe::PagedAttention`` node, lowered by
``lower_for_ort`` and run in ONNX Runtime with the caches bound in place (input and output on the
same buffer), compared with a naive per-token loop over dense histories (test_reference._Batch).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_reference import _Batch

from trtpipe.plugins.core import rope as RoPE
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import kv_encode
from trtpipe.plugins.lowering.ort import lower_for_ort
from trtpipe.plugins.ops.int4_gemm import pack as int4_pack
from trtpipe.plugins.ops.int4_gemm import reference as I4
from trtpipe.plugins.ops.paged_attention import reference as PA

IDX = ["slot_mapping", "block_tables", "context_lens", "query_start_loc"]


def _pa_model(b: _Batch) -> onnx.ModelProto:
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, None) for n in ("query", "key", "value", "key_cache", "value_cache")]
    ins += [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in IDX]
    node = helper.make_node(
        "PagedAttention",
        [i.name for i in ins],
        ["out", "key_cache_out", "value_cache_out"],
        domain="trtpipe",
        name="/model/layers.0/attn/PagedAttention",
        num_heads=b.H,
        num_kv_heads=b.KVH,
        head_size=b.D,
        scale=0.0,
        block_size=b.BS,
        sliding_window=b.W,
    )
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "key_cache_out", "value_cache_out")]
    m = helper.make_model(
        helper.make_graph([node], "pa", ins, outs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("trtpipe", 1)],
    )
    m.ir_version = 10
    return m


def _run_lowered_in_place(b: _Batch, decode: bool = False, split_decode_rows: bool = True):
    m = lower_for_ort(_pa_model(b), decode=decode, split_decode_rows=split_decode_rows)
    assert all(n.domain != "trtpipe" for n in m.graph.node)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    kc, vc = b.key_cache.copy(), b.value_cache.copy()
    kv, vv = ort.OrtValue.ortvalue_from_numpy(kc), ort.OrtValue.ortvalue_from_numpy(vc)
    bind = sess.io_binding()
    bind.bind_output("out")
    for name, arr in zip(
        ["query", "key", "value"] + IDX,
        [b.query, b.key, b.value, b.slot_mapping, b.block_tables, b.context_lens, b.qsl],
    ):
        bind.bind_cpu_input(name, arr)
    bind.bind_ortvalue_input("key_cache", kv)
    bind.bind_ortvalue_output("key_cache_out", kv)
    bind.bind_ortvalue_input("value_cache", vv)
    bind.bind_ortvalue_output("value_cache_out", vv)
    sess.run_with_iobinding(bind)
    return bind.get_outputs()[0].numpy(), kc, vc


# (W, BS, chunks): the window/blocks cases that have broken other projects
CASES = [
    pytest.param(1, 4, [(6, 3), (0, 5)], id="window-1"),
    pytest.param(4, 4, [(9, 4), (2, 1)], id="window-equals-block"),
    pytest.param(6, 4, [(13, 2), (0, 7)], id="window-not-multiple-of-block"),
    pytest.param(3, 4, [(20, 1), (17, 1)], id="decode-several-blocks-past-window"),
    pytest.param(0, 4, [(0, 2), (21, 1), (14, 1)], id="one-block-seq-with-long-ones"),
    pytest.param(0, 16, [(0, 37)], id="prefill-from-zero"),
    pytest.param(5, 4, [(7, 6), (3, 0), (0, 1)], id="chunked-prefill-empty-seq-window"),
]


# Mixed prefill calls (issue 12: a step's decodes ride in its prefill call as 1-token rows): the
# trailing 1-token rows take the decode path; a 1-token row before a longer one stays padded.
MIXED_CASES = [
    pytest.param(0, 4, [(0, 6), (9, 1), (3, 1)], id="chunk-then-two-decodes"),
    pytest.param(3, 4, [(5, 1), (0, 6), (9, 1)], id="one-token-row-before-a-chunk-window"),
    pytest.param(0, 4, [(2, 1), (11, 1), (0, 1)], id="only-one-token-rows"),
    pytest.param(2, 4, [(4, 3), (0, 5)], id="no-one-token-rows-window"),
    pytest.param(0, 4, [(6, 3), (3, 0), (12, 1)], id="empty-row-then-decode"),
]


@pytest.mark.parametrize("split_decode_rows", [True, False], ids=["split", "padded"])
@pytest.mark.parametrize("W,BS,chunks", CASES + MIXED_CASES)
def test_ort_lowering_matches_naive_and_writes_in_place(W, BS, chunks, split_decode_rows):
    rng = np.random.default_rng(BS * 100 + W)
    b = _Batch(rng, H=6, KVH=2, D=8, BS=BS, NB=16, MB=8, chunks=chunks, W=W)
    out, kc, vc = _run_lowered_in_place(b, split_decode_rows=split_decode_rows)
    np.testing.assert_allclose(out, b.expected(), rtol=1e-5, atol=1e-5)
    _, kc_ref, vc_ref = b.run()
    np.testing.assert_array_equal(kc, kc_ref)  # written in place, exactly at slot_mapping
    np.testing.assert_array_equal(vc, vc_ref)


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("mode", ["prefill", "mixed", "decode"])
def test_ort_lowering_of_each_kv_dtype_matches_the_reference(kv_dtype, mode):
    """A pool retyped to fp16 / bf16 / int8 (retype_kv_pool, in lower_for_ort) against the NumPy
    reference reading the same encoded pool: codes and int8 scales bit for bit (the graph does
    kv_codec.kv_encode's float32 operations), the output within 1e-5 (the same decoded values)."""
    rng = np.random.default_rng(23)
    chunks = [(0, 1), (9, 1), (21, 1)] if mode == "decode" else [(5, 6), (0, 3), (13, 1)]
    b = _Batch(rng, H=6, KVH=2, D=8, BS=4, NB=20, MB=8, chunks=chunks, W=3 if mode == "mixed" else 0)
    b.key[0] = 0.0  # an all-zero int8 row: scale 0, codes 0
    pool = [*kv_encode(b.key_cache, kv_dtype), *kv_encode(b.value_cache, kv_dtype)]  # kc, ks, vc, vs
    scales = [pool[1], pool[3]] if kv_dtype == "int8" else []
    want = PA.paged_attention(*b.args()[:3], pool[0], pool[2], *b.args()[5:], *scales, **b.kwargs())
    model = _pa_model(b)
    if mode == "mixed":  # as the exporter writes it: the optional outputs named, unused
        model.graph.node[0].output.extend(["unused_scale_k", "unused_scale_v"])
    m = lower_for_ort(model, decode=mode == "decode", split_decode_rows=mode == "mixed", kv_dtype=kv_dtype)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    bind = sess.io_binding()
    bind.bind_output("out")
    for name, arr in zip(["query", "key", "value"] + IDX, [*b.args()[:3], *b.args()[5:]]):
        bind.bind_cpu_input(name, arr)
    got = [pool[0].copy(), pool[2].copy(), *(x.copy() for x in scales)]
    for name, arr in zip(["key_cache", "value_cache", "key_cache_scale", "value_cache_scale"], got):
        v = (
            ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, TensorProto.BFLOAT16)
            if kv_dtype == "bf16"
            else ort.OrtValue.ortvalue_from_numpy(arr)
        )
        bind.bind_ortvalue_input(name, v)
        bind.bind_ortvalue_output(name.replace("_cache", "_cache_out"), v)
    sess.run_with_iobinding(bind)
    np.testing.assert_allclose(bind.get_outputs()[0].numpy(), want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want[1:], strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("W", [0, 1, 4, 6])
def test_decode_lowering_matches_naive(W):
    """The decode-specialized lowering (one query per sequence), window edges and ragged tables."""
    rng = np.random.default_rng(W + 11)
    b = _Batch(rng, H=6, KVH=2, D=8, BS=4, NB=20, MB=8, chunks=[(0, 1), (4, 1), (21, 1), (9, 1)], W=W)
    out, kc, _ = _run_lowered_in_place(b, decode=True)
    np.testing.assert_allclose(out, b.expected(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(kc, b.run()[1])


def test_padded_block_table_row_never_reads_other_blocks():
    """A short sequence's padded row points at block 0; poison every block it does not own."""
    rng = np.random.default_rng(7)
    b = _Batch(rng, H=2, KVH=1, D=4, BS=4, NB=12, MB=5, chunks=[(0, 2), (15, 1)])
    owned = set(b.block_tables[0, :1].tolist())
    poisoned = 0
    for blk in range(b.key_cache.shape[1]):  # [KVH, NB, BS, D]
        if blk not in owned and blk not in set(b.block_tables[1].tolist()):
            b.key_cache[:, blk] = 1e4
            b.value_cache[:, blk] = np.nan
            poisoned += 1
    assert poisoned >= 5  # the test poisons something
    out, _, _ = _run_lowered_in_place(b)
    np.testing.assert_allclose(out, b.expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("W,BS,chunks", CASES[:4])
def test_torch_op_matches_naive(W, BS, chunks):
    torch = pytest.importorskip("torch")
    import trtpipe.plugins.ops.torch_ops  # noqa: F401

    rng = np.random.default_rng(3)
    b = _Batch(rng, H=6, KVH=2, D=8, BS=BS, NB=16, MB=8, chunks=chunks, W=W)
    t = [torch.from_numpy(np.ascontiguousarray(x)) for x in b.args()]
    out, kc, vc = torch.ops.trtpipe.paged_attention(*t, None, None, b.H, b.KVH, b.D, 0.0, b.BS, b.W)
    np.testing.assert_allclose(out.numpy(), b.expected(), rtol=1e-5, atol=1e-5)
    _, kc_ref, _ = b.run()
    np.testing.assert_array_equal(kc.numpy(), kc_ref)


# ---------------------------------------------------------------------------------------------
# Int4Gemm
# ---------------------------------------------------------------------------------------------


def _gemm_model(K, N, G, packed, scales, zp):
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")]
    ins = ["A", "B", "S"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "Z"))
        ins.append("Z")
    node = helper.make_node(
        "Int4Gemm", ins, ["Y"], domain="trtpipe", name="/model/lin/Int4Gemm", K=K, N=N, group_size=G, bits=4
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("trtpipe", 1)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("zp_kind", ["none", "uint8", "uint8-all-8", "float-all-8", "float-q4_1"])
@pytest.mark.parametrize("N", [1, 3, 40])
def test_int4_gemm_lowering_matches_reference(zp_kind, N):
    """Against the NumPy reference; zero points that are all 8 (given or implicit) and GGUF Q4_1's
    float ones (offset d*(8 - zp) in the correction term) run MatMulNBits without a zero-point
    input (its symmetric kernel)."""
    rng = np.random.default_rng(N)
    K, G = 64, 32
    w = rng.standard_normal((N, K)).astype(np.float32)
    if zp_kind == "none":
        packed, scales, _ = int4_pack.quantize_rtn(w, G, symmetric=True)
        zp = None
    elif zp_kind in ("uint8-all-8", "float-all-8"):  # symmetric blocks with their zero points spelled out
        packed, scales, _ = int4_pack.quantize_rtn(w, G, symmetric=True)
        eights = np.full((N, K // G), 8, np.uint8)
        zp = int4_pack.pack_zero_points_uint8(eights) if zp_kind == "uint8-all-8" else eights.astype(np.float32)
    elif zp_kind == "uint8":
        packed, scales, zp = int4_pack.quantize_rtn(w, G, symmetric=False)
    else:  # a GGUF Q4_1 tensor: float zero points
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        raw = quantize(w, GGMLQuantizationType.Q4_1)
        packed, scales, zp = int4_pack.repack_gguf_q4_1(raw, N, K)
    a = rng.standard_normal((5, K)).astype(np.float32)
    want = I4.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
    m = lower_for_ort(_gemm_model(K, N, G, packed, scales, zp), accuracy_level=0)
    ops = [n.op_type for n in m.graph.node]
    assert "MatMulNBits" in ops and "Int4Gemm" not in ops
    (nbits,) = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits.input) == (4 if zp_kind == "uint8" else 3)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"A": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("N", [1, 40])
def test_q4_1_int8_requant_lowering_within_hand_bound(N):
    """``float_zero_points="int8"``: GGUF Q4_1 blocks re-coded as 8-bit MatMulNBits blocks. Each
    weight moves by at most d/32 (d = the block's scale), so |Y - Y_ref| <= sum_k |a_k| d_k / 32
    (+ float rounding); accuracy_level 0 keeps the activations fp32 so nothing else differs."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(7 + N)
    K, G = 96, 32
    w = rng.standard_normal((N, K)).astype(np.float32)
    packed, scales, zp = int4_pack.repack_gguf_q4_1(quantize(w, GGMLQuantizationType.Q4_1), N, K)
    a = rng.standard_normal((5, K)).astype(np.float32)
    want = I4.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
    m = lower_for_ort(_gemm_model(K, N, G, packed, scales, zp), accuracy_level=0, float_zero_points="int8")
    nodes = [n for n in m.graph.node]
    assert [n.op_type for n in nodes] == ["MatMulNBits"]  # no correction term
    assert next(x.i for x in nodes[0].attribute if x.name == "bits") == 8
    assert {t.name for t in m.graph.initializer} == set(nodes[0].input[1:])  # old codes dropped
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    d_per_k = np.repeat(scales, G, axis=1)  # [N, K]
    bound = np.abs(a) @ (d_per_k.T / 32) + 1e-4
    assert np.all(np.abs(got - want) <= bound)
    assert np.abs(got - want).max() > 0  # Q4_1 zero points are not multiples of 1/16 in general


@pytest.mark.parametrize("zp_kind", ["implicit-128", "float-128", "uint8-random"])
@pytest.mark.parametrize("M", [1, 6])
def test_8bit_head_with_fp32_activations_is_two_4bit_gemms(zp_kind, M):
    """bits=8 blocks (the GGUF Q8_0 LM head) at accuracy_level 0: ONNX Runtime has no
    fp32-activation 8-bit kernel, so the lowering splits each code into nibbles, q8 = 16 hi + lo,
    and runs two 4-bit MatMulNBits (scales 16d and d) plus the offset d*(136 - z) on the block
    sums: the NumPy reference's values to fp32 rounding. With int8 activations (level 4) the one
    8-bit MatMulNBits stays."""
    rng = np.random.default_rng(M)
    K, N, G = 96, 50, 32
    q8 = rng.integers(0, 256, (N, K // G, G), dtype=np.uint8)
    scales = (rng.random((N, K // G), dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    zp = {
        "implicit-128": None,
        "float-128": np.full((N, K // G), 128.0, np.float32),
        "uint8-random": rng.integers(0, 256, (N, K // G), dtype=np.uint8),
    }[zp_kind]
    a = rng.standard_normal((M, K)).astype(np.float32)
    want = I4.int4_gemm(a, q8, scales, zp, K=K, N=N, group_size=G, bits=8)

    def model():
        m = _gemm_model(K, N, G, q8, scales, zp)
        next(x for x in m.graph.node[0].attribute if x.name == "bits").i = 8
        return m

    m = lower_for_ort(model(), accuracy_level=0)
    nbits = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
    assert [next(x.i for x in n.attribute if x.name == "bits") for n in nbits] == [4, 4]
    assert [next(x.i for x in n.attribute if x.name == "accuracy_level") for n in nbits] == [0, 0]
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    int8 = [n for n in lower_for_ort(model(), accuracy_level=4).graph.node if n.op_type == "MatMulNBits"]
    assert [next(x.i for x in n.attribute if x.name == "bits") for n in int8] == [8]


def test_unknown_float_zero_points_mode_is_refused():
    with pytest.raises(OpError, match="float_zero_points"):
        lower_for_ort(
            _gemm_model(32, 1, 32, np.zeros((1, 1, 16), np.uint8), np.ones((1, 1), np.float32), None),
            float_zero_points="int3",
        )


def test_zero_points_0_and_15_survive_packing():
    zp = np.array([[0, 15, 15, 0, 7]], np.uint8)
    packed = int4_pack.pack_zero_points_uint8(zp)
    assert int4_pack.unpack_zero_points_uint8(packed, 1, 5).tolist() == zp.tolist()


def test_group_size_not_dividing_k_is_a_clear_error():
    with pytest.raises(OpError, match="K"):
        int4_pack.quantize_rtn(np.zeros((4, 48), np.float32), 32, symmetric=False)


def test_rope_table_at_8191_matches_float64_reference():
    cos32, sin32 = RoPE.rope_cos_sin(8192, 64, 100000.0, dtype=np.float32)
    inv = 1.0 / (100000.0 ** (np.arange(0, 64, 2, dtype=np.float64) / 64))
    ang = 8191.0 * np.concatenate([inv, inv])
    np.testing.assert_allclose(cos32[8191], np.cos(ang), atol=float(np.finfo(np.float32).eps) * 2)
    np.testing.assert_allclose(sin32[8191], np.sin(ang), atol=float(np.finfo(np.float32).eps) * 2)
    with pytest.raises(OpError):
        RoPE.check_positions(np.array([8192]), 8192)


@pytest.mark.parametrize("zp_kind", ["none", "uint8"])
def test_torch_int4_gemm_op_unpacks_nibbles_like_the_reference(zp_kind):
    """The torch custom op (the reference model's linears) reads the MatMulNBits nibbles as the
    NumPy reference does: packed codes and packed uint8 zero points (odd number of blocks)."""
    torch = pytest.importorskip("torch")
    import trtpipe.plugins.ops.torch_ops  # noqa: F401

    rng = np.random.default_rng(7)
    N, K, G = 5, 96, 32
    w = rng.standard_normal((N, K)).astype(np.float32)
    packed, scales, zp = int4_pack.quantize_rtn(w, G, symmetric=zp_kind == "none")
    a = rng.standard_normal((3, K)).astype(np.float32)
    ref = I4.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
    got = torch.ops.trtpipe.int4_gemm(
        torch.from_numpy(a),
        torch.from_numpy(packed),
        torch.from_numpy(scales),
        None if zp is None else torch.from_numpy(zp),
        K,
        N,
        G,
    )
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_head_major_pool_reaches_attention_without_a_copy(tmp_path, decode):
    """The head-major pool's gathered blocks ``[KVH, S, L, D]`` feed both attention MatMuls
    directly: after ONNX Runtime's graph optimizations no Transpose reads a gathered K or V
    (the K^T of the scores is folded into ``FusedMatMul`` transB), so per layer and step the
    pool is copied once (the Gather), not twice as with the old ``[NB, BS, KVH, D]`` layout; and
    the KV write needs no Transpose of this step's rows either."""
    rng = np.random.default_rng(3)
    chunks = [(5, 1), (20, 1)] if decode else [(5, 3), (0, 6)]
    b = _Batch(rng, H=6, KVH=2, D=8, BS=4, NB=16, MB=8, chunks=chunks)
    m = lower_for_ort(_pa_model(b), decode=decode, split_decode_rows=False)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    g = onnx.load(str(tmp_path / "optimized.onnx")).graph
    producer = {o: n for n in g.node for o in n.output}

    def from_pool_gather(name: str) -> bool:  # through Reshapes back to a Gather of a cache
        n = producer.get(name)
        while n is not None and n.op_type == "Reshape":
            n = producer.get(n.input[0])
        return n is not None and n.op_type == "Gather" and n.input[0].endswith("cache_out")

    assert [n for n in g.node if n.op_type == "Transpose" and from_pool_gather(n.input[0])] == []
    scores = [n for n in g.node if n.op_type == "FusedMatMul" and from_pool_gather(n.input[1])]
    assert len(scores) == 1
    assert {a.name: helper.get_attribute_value(a) for a in scores[0].attribute}.get("transB") == 1
    values = [n for n in g.node if n.op_type == "MatMul" and from_pool_gather(n.input[1])]
    assert len(values) == 1
    # the write takes this step's K/V rows as they come ([T, KVH, D] updates at [T, KVH, 3] indices)
    writes = [n for n in g.node if n.op_type == "ScatterND"]
    assert len(writes) == 2
    assert [producer[n.input[2]].op_type for n in writes if n.input[2] in producer] in ([], ["Reshape", "Reshape"])
