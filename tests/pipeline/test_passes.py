"""Graph passes before/after on a one-layer exported graph: the fused graph computes the same
logits as the unfused one in ONNX Runtime, with fewer nodes, and the passes are idempotent."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from trtpipe.pipeline.export import export_phase, kv_names  # noqa: E402
from trtpipe.pipeline.hf_loader import load_hf_folder  # noqa: E402
from trtpipe.pipeline.model import build_reference_model  # noqa: E402
from trtpipe.pipeline.passes import fuse_rms_norm, fuse_rotary, optimize_for_ort  # noqa: E402
from trtpipe.plugins.ort_lowering import lower_for_ort  # noqa: E402


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    ref = build_reference_model(load_hf_folder(d), "fp32")
    out = {}
    for phase in ("prefill", "decode"):
        out[phase] = onnx.load(str(export_phase(ref, phase, d / f"{phase}.onnx", 4).path))
    return out


def _run(model, phase, decode):
    sess = ort.InferenceSession(lower_for_ort(model, decode=decode).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    past, present = kv_names(1)
    kc = np.zeros((6, 4, 2, 16), np.float32)
    vc = np.zeros_like(kc)
    if phase == "prefill":
        feeds = dict(input_ids=[3, 9, 27, 4, 5], positions=[0, 1, 2, 0, 1], slot_mapping=[4, 5, 6, 12, 13],
                     block_tables=[[1, 0], [3, 0]], context_lens=[3, 2], query_start_loc=[0, 3, 5],
                     last_token_indices=[2, 4])
    else:
        feeds = dict(input_ids=[3, 9], positions=[6, 1], slot_mapping=[10, 13], block_tables=[[1, 2], [3, 0]],
                     context_lens=[7, 2])
    feeds = {k: np.asarray(v, np.int64) for k, v in feeds.items()}
    feeds.update({past[0]: kc, past[1]: vc})
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fusions_preserve_logits_and_cut_nodes(one_layer, phase):
    m = one_layer[phase]
    fused, counts = optimize_for_ort(m)
    assert counts == {"rms_norm": 3, "rotary": 2}  # 2 norms per layer + final norm; q and k
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 3 and ops.count("RotaryEmbedding") == 2
    assert "Reciprocal" not in ops and "Neg" not in ops
    assert len(fused.graph.node) < len(m.graph.node) - 20
    a = _run(m, phase, decode=False)
    b = _run(fused, phase, decode=phase == "decode")
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_passes_are_idempotent(one_layer):
    fused, _ = optimize_for_ort(one_layer["prefill"])
    again, n1 = fuse_rms_norm(fused)
    again, n2 = fuse_rotary(again)
    assert (n1, n2) == (0, 0) and len(again.graph.node) == len(fused.graph.node)


def test_docs_graphs_md_is_current():
    from pathlib import Path

    from trtpipe.pipeline.graph_docs import render_graph_io_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "graphs.md"
    assert doc.read_text() == render_graph_io_markdown(), "run: python -m trtpipe.pipeline.graph_docs > docs/graphs.md"
