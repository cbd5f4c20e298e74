"""GGUF loader on synthetic files written with the gguf package: config mapping, Q/K row
un-permutation (llama.cpp convert order) against the Hugging Face layout, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from trtpipe.pipeline.model.gguf import ModelLoadError, load_gguf  # noqa: E402


def _permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF -> GGUF row order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write(path, q_hf, k_hf, extra=None, metadata=None):
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in (metadata or {}).items():
        getattr(w, f"add_{add}")(value)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(32)
    w.add_tensor("token_embd.weight", np.ones((32, 64), np.float32))
    w.add_tensor("blk.0.attn_q.weight", _permute(q_hf, 4))
    w.add_tensor("blk.0.attn_k.weight", _permute(k_hf, 2))
    for name, t in (extra or {}).items():
        w.add_tensor(name, t[0], raw_dtype=t[1]) if isinstance(t, tuple) else w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_config_and_qk_unpermute(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 64)).astype(np.float32)
    k = rng.standard_normal((32, 64)).astype(np.float32)
    p = tmp_path / "tiny.gguf"
    _write(p, q, k)
    m = load_gguf(p, with_tokenizer=False)
    c = m.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (1, 64, 4, 2, 16)
    assert c.tie_word_embeddings  # no output.weight
    np.testing.assert_array_equal(m.float_weight("model.layers.0.self_attn.q_proj.weight"), q)
    np.testing.assert_array_equal(m.float_weight("model.layers.0.self_attn.k_proj.weight"), k)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ({"eos_token_id": 2, "eot_token_id": 5, "eom_token_id": 7}, (2, 5, 7)),  # EOM differs
        ({"eos_token_id": 2, "eom_token_id": 7}, (2, 7)),  # EOM without EOT
        ({"eos_token_id": 2, "eot_token_id": 2, "eom_token_id": 2}, (2,)),  # one id named three times
        ({}, ()),
    ],
)
def test_one_eos_list_for_model_config_and_tokenizer(tmp_path, ids, expected):
    """llama.cpp's is_eog: EOS, EOT and EOM all end a generation. The model config (which the
    scheduler stops on) and the tokenizer metadata read the same list (issue 15: the config
    used to drop EOM)."""
    from trtpipe.pipeline.model.tokenizer import end_of_generation_ids, gguf_tokenizer_metadata

    p = tmp_path / "eom.gguf"
    _write(p, np.zeros((64, 64), np.float32), np.zeros((32, 64), np.float32), metadata=ids)
    assert load_gguf(p, with_tokenizer=False).config.eos_token_ids == expected
    reader = gguf.GGUFReader(str(p))
    assert gguf_tokenizer_metadata(reader)["eos_token_ids"] == expected
    assert end_of_generation_ids(reader) == expected


@pytest.mark.parametrize(
    ("metadata", "check"),
    [
        (
            {"rope_scaling_type": gguf.RopeScalingType.LINEAR, "rope_scaling_factor": 4.0},
            lambda c: (
                c.rope_scaling is not None and (c.rope_scaling.rope_type, c.rope_scaling.factor) == ("linear", 4.0)
            ),
        ),
        ({"rope_scaling_type": gguf.RopeScalingType.NONE}, lambda c: c.rope_scaling is None),
        ({"sliding_window": 8}, lambda c: c.layer_sliding_window == (8,)),
        ({}, lambda c: c.layer_sliding_window == (0,) and c.rope_scaling is None),
    ],
)
def test_rope_scaling_and_window_metadata(tmp_path, metadata, check):
    p = tmp_path / "m.gguf"
    _write(p, np.zeros((64, 64), np.float32), np.zeros((32, 64), np.float32), metadata=metadata)
    assert check(load_gguf(p, with_tokenizer=False).config)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"rope_scaling_type": gguf.RopeScalingType.YARN}, r"llama\.rope\.scaling\.type = 'yarn' is not supported"),
        ({"rope_dimension_count": 8}, r"llama\.rope\.dimension_count = 8 differs from head_dim 16"),
    ],
)
def test_unsupported_metadata_names_key_and_value(tmp_path, metadata, message):
    p = tmp_path / "bad.gguf"
    _write(p, np.zeros((64, 64), np.float32), np.zeros((32, 64), np.float32), metadata=metadata)
    with pytest.raises(ModelLoadError, match=message):
        load_gguf(p, with_tokenizer=False)


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    q = np.zeros((64, 64), np.float32)
    k = np.zeros((32, 64), np.float32)
    raw = np.zeros((64, 84), np.uint8)  # one Q2_K super-block (256 values) per row
    p = tmp_path / "bad.gguf"
    _write(p, q, k, {"blk.0.ffn_up.weight": (raw, gguf.GGMLQuantizationType.Q2_K)})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_up\.weight.*Q2_K"):
        load_gguf(p, with_tokenizer=False)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_gguf(tmp_path / "nope.gguf")


def test_cli_help_and_runtime_import_without_torch():
    code = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, n, p=None, t=None):\n"
        "        if n.split('.')[0] in ('torch', 'onnx', 'onnxscript', 'transformers'): raise ImportError(n)\n"
        "sys.meta_path.insert(0, B())\n"
        "import trtpipe.runtime.llm, trtpipe.runtime.sched.scheduler\n"
        "from trtpipe.pipeline.cli.main import main\n"
        "sys.argv = ['trtpipe', '--help']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for cmd in ("build", "generate", "validate", "estimate", "export"):
        assert cmd in r.stdout


def test_build_removes_temp_folders_of_dead_builds(tmp_path):
    from trtpipe.pipeline.stages import _remove_stale_temp_dirs

    final = tmp_path / "recipe" / "cpu"
    final.parent.mkdir()
    dead = final.parent / ".cpu.tmp-999999999"
    alive = final.parent / f".cpu.tmp-{os.getppid()}"
    dead.mkdir()
    alive.mkdir()
    logs = []
    _remove_stale_temp_dirs(final, logs.append)
    assert not dead.exists() and alive.exists() and "interrupted build" in logs[0]


def test_recipe_that_is_not_utf8_is_a_recipe_error(tmp_path):
    from trtpipe.pipeline.recipe import RecipeError, load_recipe

    p = tmp_path / "binary.yaml"
    p.write_bytes(bytes(range(128, 256)))
    with pytest.raises(RecipeError, match="UTF-8"):
        load_recipe(p)
