"""TensorRT lowering passes (plugins/lowering/trt.py) on small hand-built graphs.

The plugin-free graphs run in ONNX Runtime (CPU) against the NumPy reference: TensorRT would
run the same standard ops. Plugin graphs are checked structurally (TensorRT's parser reads op
type, plugin_namespace, plugin_version and the attributes).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

from trtpipe.plugins import OP_DOMAIN  # noqa: E402
from trtpipe.plugins.core.errors import OpError  # noqa: E402
from trtpipe.plugins.lowering.trt import (  # noqa: E402
    PLUGIN_ATTRIBUTES,
    cast_float_graph,
    custom_nodes,
    lower_for_trt,
    lower_plugin_free,
    lower_with_plugins,
)
from trtpipe.plugins.ops.int4_gemm import pack as P  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import reference as I4  # noqa: E402
from trtpipe.plugins.ops.paged_attention import reference as PA  # noqa: E402

H, KVH, D, BS, NB = 6, 2, 16, 4, 10


def _attention_model(window: int = 0, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """One trtpipe::PagedAttention node with every input a graph input."""
    f, i64 = dtype, TensorProto.INT64
    ins = [
        helper.make_tensor_value_info("query", f, ["T", H * D]),
        helper.make_tensor_value_info("key", f, ["T", KVH * D]),
        helper.make_tensor_value_info("value", f, ["T", KVH * D]),
        helper.make_tensor_value_info("past_key.0", f, [KVH, "NB", BS, D]),
        helper.make_tensor_value_info("past_value.0", f, [KVH, "NB", BS, D]),
        helper.make_tensor_value_info("slot_mapping", i64, ["T"]),
        helper.make_tensor_value_info("block_tables", i64, ["S", "MB"]),
        helper.make_tensor_value_info("context_lens", i64, ["S"]),
        helper.make_tensor_value_info("query_start_loc", i64, ["S1"]),
    ]
    outs = [
        helper.make_tensor_value_info("out", f, ["T", H * D]),
        helper.make_tensor_value_info("present_key.0", f, [KVH, "NB", BS, D]),
        helper.make_tensor_value_info("present_value.0", f, [KVH, "NB", BS, D]),
    ]
    node = helper.make_node(
        "PagedAttention",
        [i.name for i in ins],
        [o.name for o in outs],
        name="attn",
        domain=OP_DOMAIN,
        num_heads=H,
        num_kv_heads=KVH,
        head_size=D,
        scale=0.0,
        block_size=BS,
        sliding_window=window,
    )
    g = helper.make_graph([node], "attn", ins, outs)
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10
    )


def _attention_step(rng):
    """Two sequences: 5 cached + 3 new tokens, and 0 cached + 2 new (block 0 is the null block)."""
    kc = rng.standard_normal((KVH, NB, BS, D)).astype(np.float32)
    vc = rng.standard_normal((KVH, NB, BS, D)).astype(np.float32)
    bt = np.array([[3, 7, 0], [5, 0, 0]], np.int64)
    cl = np.array([8, 2], np.int64)
    qsl = np.array([0, 3, 5], np.int64)
    slots = [int(bt[0, p // BS] * BS + p % BS) for p in range(5, 8)] + [
        int(bt[1, p // BS] * BS + p % BS) for p in range(2)
    ]
    T = 5
    feeds = {
        "query": rng.standard_normal((T, H * D)).astype(np.float32),
        "key": rng.standard_normal((T, KVH * D)).astype(np.float32),
        "value": rng.standard_normal((T, KVH * D)).astype(np.float32),
        "past_key.0": kc,
        "past_value.0": vc,
        "slot_mapping": np.array(slots, np.int64),
        "block_tables": bt,
        "context_lens": cl,
        "query_start_loc": qsl,
    }
    return feeds


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # ORT's own DequantizeLinear(INT4)+MatMul -> MatMulNBits fusion gives wrong results for signed
    # INT4 weights (measured: 0.17 abs error vs 8e-6 unfused, onnxruntime 1.31): run the graph as
    # written, which is what TensorRT parses.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.copy() for k, v in feeds.items()})


@pytest.mark.parametrize("window", [0, 3])
def test_plugin_free_attention_matches_reference(window):
    rng = np.random.default_rng(1)
    feeds = _attention_step(rng)
    lowered = lower_plugin_free(_attention_model(window))
    assert custom_nodes(lowered) == []
    assert all(o.domain != OP_DOMAIN for o in lowered.opset_import)
    out, k_out, v_out = _run(lowered, feeds)
    ref = PA.paged_attention(
        *feeds.values(), num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window
    )
    np.testing.assert_allclose(out, ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k_out, ref[1])
    np.testing.assert_array_equal(v_out, ref[2])


@pytest.mark.parametrize("window", [0, 6])
def test_plugin_free_decode_attention_matches_reference(window):
    rng = np.random.default_rng(11)
    feeds = _attention_step(rng)
    # decode step: one new token per sequence at positions 8 and 2
    feeds.update(
        query=feeds["query"][:2],
        key=feeds["key"][:2],
        value=feeds["value"][:2],
        slot_mapping=np.array([8 * BS + 0, 5 * BS + 2], np.int64),
        context_lens=np.array([9, 3], np.int64),
        block_tables=np.array([[3, 7, 8], [5, 0, 0]], np.int64),
        query_start_loc=np.array([0, 1, 2], np.int64),
    )
    lowered = lower_plugin_free(_attention_model(window), decode=True)
    assert custom_nodes(lowered) == []
    out, k_out, _ = _run(lowered, feeds)
    ref = PA.paged_attention(
        *feeds.values(), num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window
    )
    np.testing.assert_allclose(out, ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k_out, ref[1])


def test_plugin_free_attention_fp16_cast_close_to_reference():
    rng = np.random.default_rng(2)
    feeds = _attention_step(rng)
    m = lower_for_trt(_attention_model(0), dtype="fp16", plugin_free=True)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(m.graph.input) + list(m.graph.output)}
    assert types["query"] == types["past_key.0"] == types["out"] == TensorProto.FLOAT16
    assert types["slot_mapping"] == TensorProto.INT64
    f16 = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    out = _run(m, f16)[0]
    ref = PA.paged_attention(*feeds.values(), num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS)[0]
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=2e-2)


def _int4_model(K: int, N: int, G: int, packed, scales, zp) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    node = helper.make_node("Int4Gemm", inputs, ["Y"], name="gemm", domain=OP_DOMAIN, K=K, N=N, group_size=G, bits=4)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        initializer=inits,
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10
    )


def test_plugin_free_int4_symmetric_is_dequantize_matmul():
    rng = np.random.default_rng(3)
    K, N, G = 128, 48, 32
    w = rng.standard_normal((N, K)).astype(np.float32)
    packed, scales, _ = P.quantize_rtn(w, G, symmetric=True)
    zp = np.full((N, K // G), 8.0, np.float32)  # what the exporter emits for symmetric weights
    lowered = lower_plugin_free(_int4_model(K, N, G, packed, scales, zp))
    ops = [n.op_type for n in lowered.graph.node]
    assert ops == ["DequantizeLinear", "MatMul"]
    assert {t.name for t in lowered.graph.initializer}.isdisjoint({"B", "scales", "zp"})  # packed form dropped
    dq = lowered.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in dq.attribute} == {"axis": 0, "block_size": G}
    wq = next(t for t in lowered.graph.initializer if t.name == dq.input[0])
    assert wq.data_type == TensorProto.INT4 and list(wq.dims) == [K, N]
    a = rng.standard_normal((5, K)).astype(np.float32)
    (y,) = _run(lowered, {"A": a})
    np.testing.assert_allclose(y, I4.int4_gemm(a, packed, scales, None, K=K, N=N, group_size=G), rtol=1e-4, atol=1e-4)


def test_plugin_free_int4_asymmetric_is_refused_with_fix():
    rng = np.random.default_rng(4)
    K, N, G = 64, 16, 32
    packed, scales, zp = P.quantize_rtn(rng.standard_normal((N, K)).astype(np.float32), G, symmetric=False)
    with pytest.raises(OpError) as e:
        lower_plugin_free(_int4_model(K, N, G, packed, scales, zp))
    msg = str(e.value)
    assert "symmetric only" in msg and "plugin" in msg and "precision.int4.symmetric: true" in msg


def test_plugins_split_attention_into_write_and_attention():
    m = lower_with_plugins(_attention_model(window=8), decode=True)
    nodes = list(m.graph.node)
    assert [n.op_type for n in nodes] == ["PagedKVWrite", "PagedAttention"]
    write, attn = nodes
    assert list(write.input) == ["key", "value", "past_key.0", "past_value.0", "slot_mapping"]
    assert list(write.output) == ["present_key.0", "present_value.0"]
    assert list(attn.input) == [
        "query",
        "present_key.0",
        "present_value.0",
        "block_tables",
        "context_lens",
        "query_start_loc",
    ]
    for n in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.pop("plugin_namespace") == b"trtpipe" and attrs.pop("plugin_version") == b"1"
        assert set(attrs) == set(PLUGIN_ATTRIBUTES[n.op_type])
    attrs = {a.name: helper.get_attribute_value(a) for a in attn.attribute}
    assert attrs["decode"] == 1 and attrs["sliding_window"] == 8
    again = lower_with_plugins(m, decode=True)  # idempotent
    assert [n.op_type for n in again.graph.node] == ["PagedKVWrite", "PagedAttention"]


def test_plugins_int4_zero_points_become_float():
    rng = np.random.default_rng(5)
    K, N, G = 64, 16, 32
    packed, scales, zp = P.quantize_rtn(rng.standard_normal((N, K)).astype(np.float32), G, symmetric=False)
    assert zp.dtype == np.uint8
    m = lower_with_plugins(_int4_model(K, N, G, packed, scales, zp))
    (node,) = m.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    zf = inits[node.input[3]]
    assert zf.dtype == np.float32 and zf.shape == (N, K // G)
    np.testing.assert_array_equal(zf, P.unpack_zero_points_uint8(zp, N, K // G).astype(np.float32))
    m2 = lower_with_plugins(_int4_model(K, N, G, packed, scales, None))  # absent -> 8
    z8 = {t.name: numpy_helper.to_array(t) for t in m2.graph.initializer}[m2.graph.node[0].input[3]]
    assert np.all(z8 == 8.0)


def _norm_model() -> onnx.ModelProto:
    """y = (x * rsqrt(mean(x^2) + eps) * w) @ W -> logits; the exporter's RMSNorm pattern."""
    rng = np.random.default_rng(6)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
    ]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["var"]),
        helper.make_node("Sqrt", ["var"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["rstd"]),
        helper.make_node("Mul", ["x", "rstd"], ["xn"]),
        helper.make_node("Mul", ["xn", "w"], ["xw"]),
        helper.make_node("MatMul", ["xw", "W"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes,
        "norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["M", 4])],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_cast_keeps_rmsnorm_statistics_fp32_and_logits_fp32():
    m = _norm_model()
    c = cast_float_graph(m, "fp16")
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(c.graph.input) + list(c.graph.output)}
    assert types == {"x": TensorProto.FLOAT16, "logits": TensorProto.FLOAT}
    inits = {t.name: t.data_type for t in c.graph.initializer}
    assert inits["two"] == inits["eps"] == TensorProto.FLOAT  # island constants
    assert inits["w"] == inits["W"] == TensorProto.FLOAT16
    assert inits["axes"] == TensorProto.INT64
    pow_node = next(n for n in c.graph.node if n.op_type == "Pow")
    assert pow_node.input[0] == "x/to_fp32"
    # activations of 1000: x^2 = 1e6 overflows fp16 (max 65504); the fp32 island does not
    x = np.full((2, 8), 1000.0, np.float32)
    (y32,) = _run(m, {"x": x})
    (y16,) = _run(c, {"x": x.astype(np.float16)})
    assert np.all(np.isfinite(y16))
    np.testing.assert_allclose(y16, y32, rtol=1e-2, atol=1e-2)
    # idempotent: the pass marks the graph it cast
    c2 = cast_float_graph(c, "fp16")
    assert [n.op_type for n in c2.graph.node] == [n.op_type for n in c.graph.node]


def test_cast_refuses_kv_dtype_other_than_activations():
    with pytest.raises(OpError, match="kv_cache.dtype"):
        cast_float_graph(_attention_model(), "fp16", kv_dtype="fp32")


def test_unknown_custom_op_is_refused():
    node = helper.make_node("Mystery", ["x"], ["y"], domain=OP_DOMAIN)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)])
    with pytest.raises(OpError, match="Mystery"):
        lower_plugin_free(m)
    with pytest.raises(OpError, match="Mystery"):
        lower_with_plugins(m)


def test_eight_bit_lm_head_becomes_a_float_matmul_in_both_lowerings():
    rng = np.random.default_rng(7)
    K, N, G = 64, 24, 32
    codes = rng.integers(0, 256, (N, K // G, G), dtype=np.uint8)  # bits=8 layout: [N, K/G, G] bytes
    scales = (rng.random((N, K // G)) * 0.02).astype(np.float32)
    zp = np.full((N, K // G), 128.0, np.float32)
    inits = [
        numpy_helper.from_array(codes, "B"),
        numpy_helper.from_array(scales, "scales"),
        numpy_helper.from_array(zp, "zp"),
    ]
    node = helper.make_node(
        "Int4Gemm", ["A", "B", "scales", "zp"], ["Y"], name="lm_head", domain=OP_DOMAIN, K=K, N=N, group_size=G, bits=8
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        initializer=inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10
    )
    a = rng.standard_normal((3, K)).astype(np.float32)
    w = ((codes.astype(np.float32) - 128.0) * scales[:, :, None]).reshape(N, K)
    for lowered in (lower_plugin_free(m), lower_with_plugins(m)):
        assert [n.op_type for n in lowered.graph.node] == ["MatMul"]
        (y,) = _run(lowered, {"A": a})
        np.testing.assert_allclose(y, a @ w.T, rtol=1e-5, atol=1e-5)


def test_plugin_free_int4_asymmetric_can_be_requantized_symmetrically():
    rng = np.random.default_rng(5)
    K, N, G = 128, 32, 32
    w = rng.standard_normal((N, K)).astype(np.float32) + 0.5  # asymmetric blocks
    packed, scales, zp = P.quantize_rtn(w, G, symmetric=False)
    zp_float = P.unpack_zero_points_uint8(zp, N, K // G).astype(np.float32)
    lowered = lower_plugin_free(_int4_model(K, N, G, packed, scales, zp_float), asymmetric_int4="requantize_symmetric")
    assert [n.op_type for n in lowered.graph.node] == ["DequantizeLinear", "MatMul"]
    dq = lowered.graph.node[0]
    assert len(dq.input) == 2  # no zero point: TensorRT's symmetric INT4
    a = rng.standard_normal((4, K)).astype(np.float32)
    (y,) = _run(lowered, {"A": a})
    sym_packed, sym_scales = P.requantize_symmetric(packed, scales, zp_float, K, N, G)
    # exactly the weights requantize_symmetric gives (what the build measures on the CPU) ...
    np.testing.assert_allclose(
        y, I4.int4_gemm(a, sym_packed, sym_scales, None, K=K, N=N, group_size=G), rtol=1e-4, atol=1e-4
    )
    # ... and close to the asymmetric original (4-bit noise: relative RMS ~0.1 on Gaussian weights)
    y_asym = I4.int4_gemm(a, packed, scales, zp_float, K=K, N=N, group_size=G)
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
    assert rms(y - y_asym) < 0.15 * rms(y_asym)


def test_plugin_free_int4_asymmetric_can_be_dequantized_to_a_float_matmul():
    rng = np.random.default_rng(6)
    K, N, G = 64, 16, 32
    packed, scales, zp = P.quantize_rtn(rng.standard_normal((N, K)).astype(np.float32) + 0.5, G, symmetric=False)
    zp_float = P.unpack_zero_points_uint8(zp, N, K // G).astype(np.float32)
    lowered = lower_for_trt(
        _int4_model(K, N, G, packed, scales, zp_float),
        dtype="fp16",
        plugin_free=True,
        asymmetric_int4="dequantize_float",
    )
    assert [n.op_type for n in lowered.graph.node if n.op_type in ("MatMul", "DequantizeLinear")] == ["MatMul"]
    w = next(t for t in lowered.graph.initializer if "/w_dequantized_" in t.name)
    assert w.data_type == TensorProto.FLOAT16 and list(w.dims) == [K, N]
    want = I4.dequantize_int4(packed, scales, zp_float, K, N, G).T.astype(np.float16)
    np.testing.assert_array_equal(numpy_helper.to_array(w), want)
    with pytest.raises(OpError, match="asymmetric_int4 = 'maybe'"):
        lower_plugin_free(_int4_model(K, N, G, packed, scales, zp_float), asymmetric_int4="maybe")
