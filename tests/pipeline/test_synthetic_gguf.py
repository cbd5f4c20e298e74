"""The synthetic GGUF generator (pipeline/model/synthetic): a tiny shape read back through
gguf-py and the project's loader, checked against independent arithmetic (Q4_0 rounding bounds,
the file's byte layout), and the same seed giving the same bytes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from trtpipe.pipeline.model.synthetic import (
    LLAMA2_7B,
    SyntheticShape,
    SyntheticShapeError,
    default_file_name,
    float_chunks,
    smollm2_vocabulary,
    write_synthetic_gguf,
)

TINY = SyntheticShape(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512,
                      vocab_size=512, context_length=128, embed_type="Q4_0", head_type="Q6_K")  # fmt: skip


@pytest.fixture(scope="module")
def vocab(gguf_path):  # needs the SmolLM2 package (its tokenizer), as the conftest fixture says
    return smollm2_vocabulary(TINY.vocab_size)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, vocab):
    path = tmp_path_factory.mktemp("synthetic") / default_file_name(TINY, 7)
    return write_synthetic_gguf(path, TINY, seed=7, vocab=vocab)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_llama2_7b_shape_counts_its_parameters():
    # Llama-2-7B: 6,738,415,616 parameters (HF config: 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096)
    # + 2 x 32000 x 4096 + 4096)
    assert LLAMA2_7B.num_parameters() == 6_738_415_616
    assert len(LLAMA2_7B.tensors()) == 32 * 9 + 3


def test_file_reads_back_through_gguf_py(tiny_file):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(tiny_file.path))
    specs = {s.name: s for s in TINY.tensors()}
    assert [t.name for t in r.tensors] == [s.name for s in TINY.tensors()]
    for t in r.tensors:
        spec = specs[t.name]
        assert t.tensor_type.name == spec.qtype
        values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(spec.rows, spec.cols)
        if spec.qtype == "Q6_K":  # random blocks: values d * scale * (q - 32) with std ~0.02
            assert 0.015 < values.std() < 0.025 and np.isfinite(values).all()
            continue
        source = np.concatenate([x for _, _, x in float_chunks(spec, 7)])
        if spec.qtype == "F32":
            np.testing.assert_array_equal(values[0], source[0])
            continue
        # Q4_0 (ggml quantize_row_q4_0_ref): d = max / -8 over the block's largest |x|; every value
        # within |d| = max|x| / 8 of its source (|d| / 2 except the clipped +8 d end), plus d's
        # rounding to fp16 (2^-11 relative) times |q - 8| <= 8
        blocks = source.reshape(-1, 32)
        bound = np.abs(blocks).max(axis=1, keepdims=True) / 8 * (1 + 8 * 2.0**-11 + 1e-6)
        assert (np.abs(values.reshape(-1, 32) - blocks) <= bound).all(), t.name
        assert 0.015 < source.std() < 0.025


def test_file_loads_through_the_project_loader(tiny_file):
    from trtpipe.pipeline.model.gguf import load_gguf

    m = load_gguf(tiny_file.path)
    c = m.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 256, 4, 2, 64)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (512, 512, 128)
    assert c.rope_theta == 10000.0 and c.rms_norm_eps == pytest.approx(1e-5)
    assert not c.tie_word_embeddings and c.eos_token_ids == (2,)
    assert m.weights["model.layers.1.mlp.down_proj.weight"].shape == (256, 512)
    assert m.weights["lm_head.weight"].qtype == "Q6_K"
    from tokenizers import Tokenizer

    ids = Tokenizer.from_str(m.tokenizer_json).encode("<|im_start|>user the cat").ids
    assert ids[0] == 1 and max(ids) < 512  # <|im_start|> is SmolLM2's id 1


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_file, vocab, tmp_path):
    again = write_synthetic_gguf(tmp_path / "again.gguf", TINY, seed=7, vocab=vocab)
    other = write_synthetic_gguf(tmp_path / "other.gguf", TINY, seed=8, vocab=vocab)
    assert _sha(again.path) == _sha(tiny_file.path)
    assert _sha(other.path) != _sha(tiny_file.path) and other.num_bytes == tiny_file.num_bytes


def test_vocabulary_is_smollm2_cut_to_size(vocab):
    assert len(vocab.tokens) == 512 and len(vocab.merges) == 512 - 252
    assert vocab.tokens[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert vocab.merges[0] == "Ġ t" and vocab.tokens[252] == "Ġt"


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(SyntheticShapeError, match="head_type"):
        SyntheticShape(head_type="Q4_K").check()
    with pytest.raises(SyntheticShapeError, match="multiples of Q6_K's block of 256"):
        SyntheticShape(hidden_size=96, num_heads=3, num_kv_heads=3).check()
