"""llama.cpp's Q4_0 layout on the native engine (issue 44): Q4_0 linears, a Q4_0 embedding
(gathered from Q8 tiles whose codes are Q4_0's q - 8, exactly) and an untied Q6_K head (I8 tiles,
group 16), as ``llama-quantize ... Q4_0`` writes Llama-2-7B. A tiny synthetic Llama in those types
(pipeline/model/synthetic), built by `trtpipe build` for the native engine; its teacher-forced logits
against the layer-by-layer NumPy reference (pipeline/model/layerwise.py) on the same GGUF."""

from __future__ import annotations

import numpy as np
import pytest

from trtpipe.plugins.cpu.compile import compiler
from trtpipe.plugins.cpu.isa import host_isa

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,  # a build: export, lowering, golden (~30-60 s on a busy 2-core host)
    pytest.mark.skipif(host_isa() is None or compiler() is None, reason="needs x86-64 AVX2 and a C compiler"),
]

RECIPE = """\
name: tiny-llama-q4-0
model: {{source: {model}}}
target: cpu
precision: {{prefill: int4, decode: int4}}
kv_cache: {{block_size: 16, num_blocks: 16, dtype: fp32}}
max_seq_len: 128
max_batch_size: 2
max_num_tokens: 64
engine: {{cpu_backend: native, cpu_activation_levels: 2}}
validate: {{correctness: {{num_tokens: 2}}}}
"""


@pytest.fixture(scope="module")
def built(gguf_path, tmp_path_factory):
    from trtpipe.pipeline.model.synthetic import SyntheticShape, smollm2_vocabulary, write_synthetic_gguf
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.pipeline.stages import build

    shape = SyntheticShape(
        num_layers=2,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=512,
        vocab_size=512,
        context_length=128,
    )  # fmt: skip (Q4_0 / Q4_0 / Q6_K: the defaults)
    d = tmp_path_factory.mktemp("q4-0-layout")
    path = write_synthetic_gguf(d / "tiny.gguf", shape, seed=5, vocab=smollm2_vocabulary(shape.vocab_size)).path
    (d / "tiny.yaml").write_text(RECIPE.format(model=path))
    return path, build(load_recipe(d / "tiny.yaml"), d / "artifacts", log=lambda s: None).artifact_dir


def test_native_runs_llama_cpp_q4_0_layout(built):
    from trtpipe.pipeline.model.gguf import load_gguf
    from trtpipe.pipeline.model.layerwise import layerwise_logits
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_logits

    path, art = built
    loaded = load_gguf(path, with_tokenizer=False)
    assert (loaded.weights["model.embed_tokens.weight"].qtype, loaded.weights["lm_head.weight"].qtype) == (
        "Q4_0",
        "Q6_K",
    )
    llm = LLM(art, engine="native", prefix_caching=False)
    tables = llm.manifest.options.native.tensors
    assert tables["embed.codes"][0] == "uint8" and "embed.m" not in tables  # Q8 tiles
    assert "head.scale" in tables  # I8 tiles (Q6_K: fp32 scale per 16)
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 512, 40)]
    positions = [0, 5, 13, 21, 30, 39]
    want = layerwise_logits(loaded, ids, positions).logits
    got = teacher_forced_logits(llm, ids[:1], ids[1:] + [0])[positions]  # row i: position i
    # int8 activations (two levels) against fp32: measured 1.6e-4 on logits up to 1.16 (avx2, Zen 3)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    assert (got.argmax(-1) == want.argmax(-1)).all()
