"""A tiny Gemma 3 exported through the paged path (issue 42): the prefill and decode graphs, in
ONNX Runtime before and after the ORT fusions, give the reference's dense logits (per-layer window
and RoPE base, QK-norm, sandwich norms, GELU-tanh, embedding scale and final soft-cap all in the
graph). Tolerance 1e-4 (fp32). Slow: two torch.export runs (~2 min on 2 busy cores)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from trtpipe.pipeline.model.hf import load_hf_folder  # noqa: E402
from trtpipe.pipeline.model.reference import build_reference_model  # noqa: E402
from trtpipe.pipeline.passes import optimize_for_ort  # noqa: E402
from trtpipe.pipeline.stages.export import export_phase, kv_names  # noqa: E402
from trtpipe.plugins.lowering.ort import lower_for_ort  # noqa: E402

BS, WINDOW, N = 4, 4, 11  # block size, sliding window, prompt tokens (> window)
TOKENS = [5, 17, 3, 99, 42, 8, 64, 23, 71, 2, 50, 11]  # prompt = TOKENS[:N], then one decode step


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_gemma3")
    cfg = transformers.Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        final_logit_softcapping=3.0,
    )
    torch.manual_seed(0)
    m = transformers.Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
    m.save_pretrained(d, safe_serialization=True)
    ref = build_reference_model(load_hf_folder(d))
    graphs = {ph: onnx.load(str(export_phase(ref, ph, d / f"{ph}.onnx", BS).path)) for ph in ("prefill", "decode")}
    return ref, graphs


def _session(model, decode):
    return ort.InferenceSession(
        lower_for_ort(model, decode=decode).SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _prefill_then_decode(graphs, fused):
    """Prefill TOKENS[:N] (one sequence, blocks 1..3), then decode TOKENS[N] at position N;
    returns both steps' logits [2, V]."""
    past, present = kv_names(2)
    pre, dec = graphs["prefill"], graphs["decode"]
    if fused:
        pre, dec = optimize_for_ort(pre)[0], optimize_for_ort(dec)[0]
    kv = {name: np.zeros((2, 5, BS, 16), np.float32) for name in past}  # [KVH, NB, BS, D]
    table = np.array([[1, 2, 3, 4]], np.int64)
    slots = [int(table[0, p // BS]) * BS + p % BS for p in range(N + 1)]
    i64 = lambda x: np.asarray(x, np.int64)  # noqa: E731
    feeds = dict(
        input_ids=i64(TOKENS[:N]),
        positions=i64(range(N)),
        slot_mapping=i64(slots[:N]),
        block_tables=table,
        context_lens=i64([N]),
        query_start_loc=i64([0, N]),
        last_token_indices=i64([N - 1]),
    )
    out = _session(pre, False).run(None, {**feeds, **kv})
    kv = dict(zip(past, out[1:], strict=True))
    feeds = dict(
        input_ids=i64([TOKENS[N]]),
        positions=i64([N]),
        slot_mapping=i64([slots[N]]),
        block_tables=table,
        context_lens=i64([N + 1]),
    )
    step = _session(dec, fused).run(None, {**feeds, **kv})
    return np.concatenate([out[0], step[0]])


@pytest.mark.parametrize("fused", [False, True])
def test_gemma3_graphs_match_the_dense_reference(gemma3, fused):
    ref, graphs = gemma3
    want = ref.forward_dense(torch.tensor([TOKENS]))[0].numpy()[[N - 1, N]]
    got = _prefill_then_decode(graphs, fused)
    assert float(np.abs(got - want).max()) <= 1e-4
