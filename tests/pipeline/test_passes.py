"""Graph passes before/after on a one-layer exported graph: the fused graph computes the same
logits as the unfused one in ONNX Runtime, with fewer nodes, and the passes are idempotent."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from trtpipe.pipeline.model.hf import load_hf_folder  # noqa: E402
from trtpipe.pipeline.model.reference import build_reference_model  # noqa: E402
from trtpipe.pipeline.passes import optimize_for_ort  # noqa: E402
from trtpipe.pipeline.stages.export import export_phase, kv_names  # noqa: E402
from trtpipe.plugins.lowering.ort import lower_for_ort  # noqa: E402


def _export_one_layer(d, precision):
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    ref = build_reference_model(load_hf_folder(d), precision, 16, False)
    return {
        phase: onnx.load(str(export_phase(ref, phase, d / f"{phase}.onnx", 4).path)) for phase in ("prefill", "decode")
    }


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    return _export_one_layer(tmp_path_factory.mktemp("tiny"), "fp32")


@pytest.fixture(scope="module")
def one_layer_int4(tmp_path_factory):
    """Asymmetric RTN INT4, group 16: uint8 zero points, so lowering is MatMulNBits 1:1."""
    return _export_one_layer(tmp_path_factory.mktemp("tiny_int4"), "int4")


def _run(model, phase, decode):
    sess = ort.InferenceSession(
        lower_for_ort(model, decode=decode).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    past, present = kv_names(1)
    kc = np.zeros((2, 6, 4, 16), np.float32)  # [KVH, NB, BS, D]
    vc = np.zeros_like(kc)
    if phase == "prefill":
        feeds = dict(
            input_ids=[3, 9, 27, 4, 5],
            positions=[0, 1, 2, 0, 1],
            slot_mapping=[4, 5, 6, 12, 13],
            block_tables=[[1, 0], [3, 0]],
            context_lens=[3, 2],
            query_start_loc=[0, 3, 5],
            last_token_indices=[2, 4],
        )
    else:
        feeds = dict(
            input_ids=[3, 9],
            positions=[6, 1],
            slot_mapping=[10, 13],
            block_tables=[[1, 2], [3, 0]],
            context_lens=[7, 2],
        )
    feeds = {k: np.asarray(v, np.int64) for k, v in feeds.items()}
    feeds.update({past[0]: kc, past[1]: vc})
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fusions_preserve_logits_and_cut_nodes(one_layer, phase):
    m = one_layer[phase]
    fused, counts = optimize_for_ort(m)
    # 2 norms per layer + final norm; q and k; no Int4Gemm in an fp32 graph
    assert counts == {"rms_norm": 3, "rotary": 2, "int4_siblings": 0, "rotary_qk": 0, "silu": 1}
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 3 and ops.count("RotaryEmbedding") == 2
    assert ops.count("QuickGelu") == 1 and "Sigmoid" not in ops
    assert "Reciprocal" not in ops and "Neg" not in ops
    assert len(fused.graph.node) < len(m.graph.node) - 20
    a = _run(m, phase, decode=False)
    b = _run(fused, phase, decode=phase == "decode")
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_int4_sibling_and_rotary_fusions_preserve_logits(one_layer_int4, phase):
    """q/k/v and gate/up Int4Gemm -> one Int4Gemm + Split each; q and k RoPE -> one node over
    q||k heads. Row concatenation keeps every output row's blocks, so logits match the unfused
    graph to float rounding (the fused GEMM sums the same products)."""
    m = one_layer_int4[phase]
    fused, counts = optimize_for_ort(m)
    assert counts["int4_siblings"] == 2 and counts["rotary_qk"] == 1
    gemms = [n for n in fused.graph.node if n.op_type == "Int4Gemm"]
    ns = sorted(next(a.i for a in n.attribute if a.name == "N") for n in gemms)
    # o_proj 64, down 64, q|k|v 64+32+32, gate|up 128+128 (the HF LM head stays fp32 here)
    assert ns == [64, 64, 128, 256]
    assert [n.op_type for n in fused.graph.node].count("RotaryEmbedding") == 1
    a = _run(m, phase, decode=False)
    b = _run(fused, phase, decode=phase == "decode")
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


def test_passes_are_idempotent(one_layer, one_layer_int4):
    for m in (one_layer["prefill"], one_layer_int4["decode"]):
        fused, _ = optimize_for_ort(m)
        again, counts = optimize_for_ort(fused)
        assert set(counts.values()) == {0} and len(again.graph.node) == len(fused.graph.node)


def test_toposort_puts_a_fused_node_before_consumers_of_its_outputs():
    from onnx import helper as h

    from trtpipe.pipeline.passes import toposort as _toposort

    g = h.make_graph([], "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])], [])
    use_a = h.make_node("Neg", ["a"], ["y"], name="use_a")
    make_a = h.make_node("Abs", ["x"], ["a"], name="make_a")
    assert [n.name for n in _toposort([use_a, make_a], g)] == ["make_a", "use_a"]
    with pytest.raises(ValueError, match="no producer"):
        _toposort([h.make_node("Neg", ["missing"], ["z"], name="bad")], g)


def test_docs_graphs_md_is_current():
    from pathlib import Path

    from trtpipe.pipeline.stages.graph_docs import render_graph_io_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "graphs.md"
    assert doc.read_text() == render_graph_io_markdown(), (
        "run: python -m trtpipe.pipeline.stages.graph_docs > docs/graphs.md"
    )
