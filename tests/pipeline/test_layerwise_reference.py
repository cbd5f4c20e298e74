"""The layer-by-layer NumPy reference (pipeline/model/layerwise.py) against the torch reference's
dense forward (fp32 weights, pipeline/model/reference): a synthetic Llama (Q4_0 linears and
embedding, Q6_K head, GQA 4/2) and the real SmolLM2-135M (Q4_1, GQA 9/3, tied head)."""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.pipeline.model.layerwise import LayerwiseError, layerwise_logits
from trtpipe.pipeline.model.synthetic import SyntheticShape, smollm2_vocabulary, write_synthetic_gguf

TINY = SyntheticShape(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512,
                      vocab_size=512, context_length=128)  # fmt: skip
POSITIONS = [0, 3, 11, 20, 31, 32, 38, 39]


def _torch_logits(loaded, ids, positions):
    import torch

    from trtpipe.pipeline.model.reference import build_reference_model

    ref = build_reference_model(loaded, "fp32", rope_table_len=len(ids))
    return ref.forward_dense(torch.tensor([ids]))[0].numpy()[positions]


@pytest.fixture(scope="module")
def tiny(gguf_path, tmp_path_factory):
    from trtpipe.pipeline.model.gguf import load_gguf

    path = tmp_path_factory.mktemp("layerwise") / "tiny.gguf"
    write_synthetic_gguf(path, TINY, seed=3, vocab=smollm2_vocabulary(TINY.vocab_size))
    return load_gguf(path, with_tokenizer=False)


def test_synthetic_llama_matches_the_torch_reference(tiny):
    ids = [int(x) for x in np.random.default_rng(0).integers(0, TINY.vocab_size, 40)]
    got = layerwise_logits(tiny, ids, POSITIONS, head_rows_per_chunk=100)  # chunks not dividing the vocab
    want = _torch_logits(tiny, ids, POSITIONS)
    assert got.logits.shape == (8, 512)
    # measured 7.7e-7 on logits of magnitude ~1 (fp32, different summation orders)
    np.testing.assert_allclose(got.logits, want, atol=1e-5, rtol=0)
    assert (got.logits.argmax(-1) == want.argmax(-1)).all()
    # one layer's fp32 weights: 4 x (2 x 256^2 + 2 x 128 x 256 + 3 x 256 x 512 + 2 x 256)
    assert got.max_layer_weight_bytes == 4 * (2 * 256**2 + 2 * 128 * 256 + 3 * 256 * 512 + 2 * 256)


@pytest.mark.slow  # ~17 s on a loaded 2-core host: two 30-layer forwards
def test_smollm2_matches_the_torch_reference(smollm2):
    ids = [1, 9690, 198, 2683, 314, 253, 5356, 10346, 30, 2, 198, 1, 4093, 198, 1780, 314]
    positions = [0, 4, 9, 15]
    got = layerwise_logits(smollm2, ids, positions)
    want = _torch_logits(smollm2, ids, positions)
    # measured 8.6e-5 on logits up to 26.3 (3e-6 relative; fp32 over 30 layers)
    np.testing.assert_allclose(got.logits, want, atol=3e-4, rtol=0)
    assert (got.logits.argmax(-1) == want.argmax(-1)).all()


def test_refuses_positions_outside_the_sequence(tiny):
    with pytest.raises(LayerwiseError, match="positions"):
        layerwise_logits(tiny, [1, 2, 3], [3])
