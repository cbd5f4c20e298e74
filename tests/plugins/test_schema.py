"""Tests of the trtpipe op schemas (plugins/ops/abi.py): checker, shape inference, ABI hash."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from trtpipe.plugins.ops import abi as schema

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402

OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("trtpipe", 1)]


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=10)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _shape(vi):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def _paged_attention_model(elem=TP.FLOAT, cache_elem=None, q_dim=4 * 8, attrs=None):
    cache_elem = cache_elem or elem
    a = dict(num_heads=4, num_kv_heads=2, head_size=8, block_size=16, sliding_window=0)
    a.update(attrs or {})
    node = helper.make_node(
        "PagedAttention",
        [
            "query",
            "key",
            "value",
            "key_cache",
            "value_cache",
            "slot_mapping",
            "block_tables",
            "context_lens",
            "query_start_loc",
        ],
        ["attn", "key_cache_out", "value_cache_out"],
        domain="trtpipe",
        name="/model/layers.0/attn/PagedAttention",
        **a,
    )
    # a downstream node, so that 'attn' is an intermediate whose value_info must be inferred
    add = helper.make_node("Add", ["attn", "attn"], ["out"])
    inputs = [
        _vi("query", elem, ["T", q_dim]),
        _vi("key", elem, ["T", 16]),
        _vi("value", elem, ["T", 16]),
        _vi("key_cache", cache_elem, [2, "NB", 16, 8]),
        _vi("value_cache", cache_elem, [2, "NB", 16, 8]),
        _vi("slot_mapping", TP.INT64, ["T"]),
        _vi("block_tables", TP.INT64, ["S", "MB"]),
        _vi("context_lens", TP.INT64, ["S"]),
        _vi("query_start_loc", TP.INT64, ["S1"]),
    ]
    # declared types with unknown dims: inference must fill them in
    outputs = [
        _vi("out", elem, [None, None]),
        _vi("key_cache_out", cache_elem, [None] * 4),
        _vi("value_cache_out", cache_elem, [None] * 4),
    ]
    return _model([node, add], inputs, outputs)


def test_paged_attention_check_and_infer():
    m = _paged_attention_model()
    onnx.checker.check_model(m)
    inferred = schema.infer_trtpipe_shapes(m)
    onnx.checker.check_model(inferred, full_check=True)
    vi = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    assert _shape(vi["attn"]) == ["T", 32] and vi["attn"].type.tensor_type.elem_type == TP.FLOAT
    assert _shape(vi["out"]) == ["T", 32]
    assert _shape(vi["key_cache_out"]) == [2, "NB", 16, 8]
    assert _shape(vi["value_cache_out"]) == [2, "NB", 16, 8]


def test_paged_attention_float16_and_mixed_cache_dtype():
    for elem, cache in ((TP.FLOAT16, TP.FLOAT16), (TP.FLOAT, TP.FLOAT16)):
        inferred = schema.infer_trtpipe_shapes(_paged_attention_model(elem, cache))
        vi = {v.name: v for v in inferred.graph.value_info}
        assert vi["attn"].type.tensor_type.elem_type == elem


def test_paged_attention_shape_conflict_and_bad_types_rejected():
    schema.register_schemas()
    with pytest.raises(onnx.shape_inference.InferenceError, match="query dim 1 is 30, expected 32"):
        schema.infer_trtpipe_shapes(_paged_attention_model(q_dim=30))
    with pytest.raises(onnx.shape_inference.InferenceError, match="key_cache"):
        schema.infer_trtpipe_shapes(_paged_attention_model(attrs={"block_size": 32}))
    m = _paged_attention_model(elem=TP.DOUBLE)
    with pytest.raises(Exception, match="(?i)type"):
        schema.infer_trtpipe_shapes(m)
    m = _paged_attention_model()
    attrs = m.graph.node[0].attribute
    del attrs[[a.name for a in attrs].index("num_heads")]  # required
    with pytest.raises(onnx.checker.ValidationError, match="num_heads"):
        onnx.checker.check_model(m)


def _int4_gemm_model(zp=None, a_shape=("B", "S", 64), K=64, N=48, G=32, elem=TP.FLOAT):
    names = ["A", "B", "scales"]
    inputs = [_vi("A", elem, list(a_shape)), _vi("B", TP.UINT8, [N, K // G, G // 2]), _vi("scales", elem, [N, K // G])]
    if zp is not None:
        names.append("zero_points")
        inputs.append(_vi("zero_points", zp[0], list(zp[1])))
    node = helper.make_node("Int4Gemm", names, ["Y"], domain="trtpipe", K=K, N=N, group_size=G, bits=4)
    return _model([node], inputs, [_vi("Y", elem, [None] * len(a_shape))])


@pytest.mark.parametrize("zp", [None, (TP.UINT8, [48, 1]), (TP.FLOAT, [48, 2])])
def test_int4_gemm_check_and_infer(zp):
    m = _int4_gemm_model(zp)
    onnx.checker.check_model(m)
    inferred = schema.infer_trtpipe_shapes(m)
    onnx.checker.check_model(inferred, full_check=True)
    assert _shape(inferred.graph.output[0]) == ["B", "S", 48]


def test_int4_gemm_inference_rejects_contradictions():
    with pytest.raises(onnx.shape_inference.InferenceError, match="input A dim 1 is 32, expected 64"):
        schema.infer_trtpipe_shapes(_int4_gemm_model(a_shape=("M", 32)))
    with pytest.raises(onnx.shape_inference.InferenceError, match="zero_points"):
        schema.infer_trtpipe_shapes(_int4_gemm_model(zp=(TP.UINT8, [48, 2])))


def test_register_is_idempotent_and_schema_matches_contract():
    schema.register_schemas()
    schema.register_schemas()
    s = onnx.defs.get_schema("PagedAttention", 1, "trtpipe")
    assert [i.name for i in s.inputs] == [
        "query",
        "key",
        "value",
        "key_cache",
        "value_cache",
        "slot_mapping",
        "block_tables",
        "context_lens",
        "query_start_loc",
        "key_scale",
        "value_scale",
    ]
    assert [o.name for o in s.outputs] == [
        "output",
        "key_cache_out",
        "value_cache_out",
        "key_scale_out",
        "value_scale_out",
    ]
    assert s.attributes["num_heads"].required and not s.attributes["sliding_window"].required
    assert s.attributes["scale"].default_value.f == 0.0
    g = onnx.defs.get_schema("Int4Gemm", 1, "trtpipe")
    assert g.attributes["bits"].default_value.i == 4
    assert g.inputs[3].option == onnx.defs.OpSchema.FormalParameterOption.Optional


def test_abi_hash_is_stable_and_sensitive():
    h = schema.op_schema_abi_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert h == schema.op_schema_abi_hash()
    text = schema.op_schema_canonical_text()
    assert '"PagedAttention"' in text and '"sliding_window","int",0' in text
    spec = schema.OP_SPECS["Int4Gemm"]
    try:
        schema.OP_SPECS["Int4Gemm"] = dataclasses.replace(spec, attributes=spec.attributes[:-1])
        assert schema.op_schema_abi_hash() != h
    finally:
        schema.OP_SPECS["Int4Gemm"] = spec
    assert schema.op_schema_abi_hash() == h


def test_abi_hash_needs_no_onnx():
    """The runtime computes the hash on the target, where onnx may be absent."""
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "from trtpipe.plugins.ops.abi import op_schema_abi_hash; print(op_schema_abi_hash())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == schema.op_schema_abi_hash()
