"""plugins/graph/rewrite.py: the node walk both lowerings share, on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.graph.rewrite import (
    GraphRewrite,
    NodeBuilder,
    finish_lowering,
    node_attributes,
    rewrite_custom_nodes,
)
from trtpipe.plugins.ops.paged_attention.lower_onnx import lower_paged_attention

IDX = ["slot_mapping", "block_tables", "context_lens", "query_start_loc"]


def _chain_model() -> onnx.ModelProto:
    """x -> Relu -> trtpipe::Foo(alpha=2) -> Neg -> y, plus an initializer nobody will read."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Foo", ["a"], ["b"], name="foo", domain=OP_DOMAIN, alpha=2),
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f, [2])],
        [helper.make_tensor_value_info("y", f, [2])],
        initializer=[numpy_helper.from_array(np.zeros(3, np.float32), "unused")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)])
    m.functions.append(onnx.FunctionProto(name="Foo", domain=OP_DOMAIN))
    return m


def _double(node: onnx.NodeProto, state: GraphRewrite) -> None:
    b = NodeBuilder(node.name)
    two = b.const(np.float32(node_attributes(node)["alpha"]), np.float32, hint="alpha")
    b.op("Mul", [node.input[0], two], "scale", outputs=list(node.output))
    state.emit(b)


def test_rewrite_replaces_custom_nodes_in_place_and_keeps_the_rest():
    m = _chain_model()
    before = m.SerializeToString()
    out = rewrite_custom_nodes(m, _double)
    assert m.SerializeToString() == before  # the input model is never mutated
    assert [(n.name, n.op_type) for n in out.graph.node] == [("relu", "Relu"), ("foo/scale_2", "Mul"), ("neg", "Neg")]
    assert [t.name for t in out.graph.initializer] == ["unused", "foo/alpha_1"]  # appended after the existing
    assert numpy_helper.to_array(out.graph.initializer[1]) == np.float32(2)
    finish_lowering(out)
    assert [t.name for t in out.graph.initializer] == ["foo/alpha_1"]
    assert [o.domain for o in out.opset_import] == [""] and len(out.functions) == 0


def test_keep_predicate_and_plugin_opset():
    m = _chain_model()
    out = finish_lowering(rewrite_custom_nodes(m, _double, keep=lambda n: n.name == "foo"), keep_custom_opset=True)
    assert [n.op_type for n in out.graph.node] == ["Relu", "Foo", "Neg"]
    assert sorted(o.domain for o in out.opset_import) == ["", OP_DOMAIN] and len(out.functions) == 0


def test_rewrite_errors_are_the_rewrites():
    def refuse(node, state):
        raise ValueError(f"no lowering for {node.op_type}")

    with pytest.raises(ValueError, match="no lowering for Foo"):
        rewrite_custom_nodes(_chain_model(), refuse)


def _two_layer_attention() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, None) for n in ("q", "k", "v", "kc0", "vc0", "kc1", "vc1")]
    ins += [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in IDX]
    attrs = dict(num_heads=4, num_kv_heads=2, head_size=8, scale=0.0, block_size=4, sliding_window=0)
    nodes = [
        helper.make_node(
            "PagedAttention",
            ["q", "k", "v", f"kc{i}", f"vc{i}", *IDX],
            [f"o{i}", f"kco{i}", f"vco{i}"],
            name=f"/model/layers.{i}/attn",
            domain=OP_DOMAIN,
            **attrs,
        )
        for i in range(2)
    ]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("o0", "o1")]
    return helper.make_model(
        helper.make_graph(nodes, "pa", ins, outs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(OP_DOMAIN, 1)],
    )


@pytest.mark.parametrize("decode", [False, True])
def test_attention_index_subgraph_is_built_once_for_all_layers(decode):
    def lower(node, state):
        lower_paged_attention(node, state, decode=decode)

    model = _two_layer_attention()
    two = rewrite_custom_nodes(model, lower)
    del model.graph.node[1:]  # layer 0 alone
    one = rewrite_custom_nodes(model, lower)
    pos = {n.name: i for i, n in enumerate(two.graph.node)}
    index = [name for name in pos if name.startswith("/model/paged_attention_index/")]
    layer1 = [i for name, i in pos.items() if name.startswith("/model/layers.1/")]
    assert index and layer1 and len(pos) == len(two.graph.node)  # stable, unique names
    # one index subgraph, as large as for one layer, before every layer that reads it
    assert len(index) == sum(n.name.startswith("/model/paged_attention_index/") for n in one.graph.node)
    assert max(pos[name] for name in index) < min(layer1)
    # layer 1 reuses layer 0's causal mask (Unsqueeze hint "mask5d_w0" prefill, "mask4d_w0" decode)
    masks = [name for name in pos if "/mask5d_w0_" in name or "/mask4d_w0_" in name]
    assert len(masks) == 1 and masks[0].startswith("/model/layers.0/")
