"""A tiny Llama GGUF whose linears mix Q4_K, Q5_0, Q8_0, Q5_K, Q5_1, Q4_0 and Q6_K (what Q4_K_M
files hold), written with gguf-py (blocks from ``gguf.quants.quantize``): the loader keeps the raw
blocks and dequantizes them exactly; an int4 build re-quantizes those exact floats; the native
CPU engine refuses the model naming a tensor, its type and the fix; the bytes a decode step reads
per GGUF type match hand-computed figures."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from trtpipe.pipeline.model.gguf import load_gguf  # noqa: E402
from trtpipe.pipeline.model.quantize import PackedWeights, QuantSpec, quantize_model  # noqa: E402
from trtpipe.pipeline.model.step_bytes import GgufStepBytes, decode_step_bytes, step_bytes_by_type  # noqa: E402
from trtpipe.plugins.core.gguf_blocks import dequantize_blocks  # noqa: E402
from trtpipe.plugins.ops.int4_gemm.layout import dequantize_codes, unpack_int4_codes, zero_points_float  # noqa: E402

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 256, 512, 4, 2, 32
# GGUF name -> (Hugging Face name, [N, K], GGUF type)
LINEARS = {
    "attn_q": ("self_attn.q_proj", (HIDDEN, HIDDEN), "Q4_K"),
    "attn_k": ("self_attn.k_proj", (128, HIDDEN), "Q5_0"),
    "attn_v": ("self_attn.v_proj", (128, HIDDEN), "Q8_0"),
    "attn_output": ("self_attn.o_proj", (HIDDEN, HIDDEN), "Q5_K"),
    "ffn_gate": ("mlp.gate_proj", (FFN, HIDDEN), "Q5_1"),
    "ffn_up": ("mlp.up_proj", (FFN, HIDDEN), "Q4_0"),
    "ffn_down": ("mlp.down_proj", (HIDDEN, FFN), "Q6_K"),
}


def _permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF -> GGUF row order), on whole rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_k_rows(rng, qtype: str, N: int, K: int) -> np.ndarray:
    """k-quant rows (gguf-py cannot quantize to them): random code and 6-bit scale bytes, small
    fp16 super-block scales d (and dmin) in [1e-4, 1e-3)."""
    block_size, block_bytes = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    b = rng.integers(0, 256, (N, K // block_size, block_bytes), dtype=np.uint8)
    for at in (208,) if qtype == "Q6_K" else (0, 2):
        d = rng.uniform(1e-4, 1e-3, b.shape[:2]).astype(np.float16)
        b[..., at : at + 2] = d.view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(N, -1)


def _write_tiny(path, tied: bool) -> dict[str, np.ndarray]:
    """Write the model; returns HF name -> raw blocks in Hugging Face row order."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in (("block_count", 1), ("context_length", 256), ("embedding_length", HIDDEN)):
        getattr(w, f"add_{add}")(value)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    raws: dict[str, np.ndarray] = {}

    def add_q(gguf_name, hf_name, shape, qtype, n_head=0):
        T = gguf.GGMLQuantizationType[qtype]
        if qtype.endswith("_K"):
            raw = _random_k_rows(rng, qtype, *shape)
        else:
            raw = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32) * 0.05, T)
        raws[hf_name] = raw
        w.add_tensor(gguf_name, _permute(raw, n_head) if n_head else raw, raw_dtype=T)

    add_q("token_embd.weight", "model.embed_tokens.weight", (VOCAB, HIDDEN), "Q8_0")
    if not tied:
        add_q("output.weight", "lm_head.weight", (VOCAB, HIDDEN), "Q6_K")
    for norm in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(norm, np.ones(HIDDEN, np.float32))
    for g, (hf, shape, qtype) in LINEARS.items():
        n_head = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(g, 0)
        add_q(f"blk.0.{g}.weight", f"model.layers.0.{hf}.weight", shape, qtype, n_head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raws


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("q4km") / "tiny-q4km.gguf"
    raws = _write_tiny(path, tied=False)
    return path, raws, load_gguf(path, with_tokenizer=False)


def test_loader_keeps_blocks_and_dequantizes_exactly(tiny):
    _, raws, model = tiny
    for gguf_name, (hf, (N, K), qtype) in LINEARS.items():
        t = model.weights[f"model.layers.0.{hf}.weight"]
        assert (t.qtype, t.shape, t.data.dtype) == (qtype, (N, K), np.uint8), gguf_name
        np.testing.assert_array_equal(t.data, raws[t.name])  # Q/K rows back in Hugging Face order
        ref = gguf.quants.dequantize(raws[t.name], gguf.GGMLQuantizationType[qtype])
        np.testing.assert_array_equal(t.to_float().view(np.uint32), ref.view(np.uint32))
        np.testing.assert_array_equal(dequantize_blocks(t.data, qtype).view(np.uint32), ref.view(np.uint32))
    assert model.weights["lm_head.weight"].qtype == "Q6_K"


def test_int4_build_requantizes_the_exact_floats(tiny):
    """Q4_0 stays an exact repack; the other types are quantized round-to-nearest from gguf's
    exact floats (every weight within half a step of its group); the Q6_K head stays float."""
    _, _, model = tiny
    weights = quantize_model(model, QuantSpec("int4", 32))
    for hf, (N, K), qtype in LINEARS.values():
        name = f"model.layers.0.{hf}.weight"
        pw = weights.linears[name]
        assert isinstance(pw, PackedWeights) and (pw.N, pw.K, pw.group_size) == (N, K, 32)
        deq = dequantize_codes(
            unpack_int4_codes(pw.packed, K, N, 32), pw.scales, zero_points_float(pw.zero_points, N, K // 32), 32
        )
        exact = model.float_weight(name)
        if qtype == "Q4_0":
            np.testing.assert_array_equal(deq, exact)
        else:
            step = np.repeat(pw.scales, 32, axis=1)
            assert np.all(np.abs(deq - exact) <= step * 0.5001 + 1e-7), name
            assert not np.array_equal(deq, exact)  # re-quantized, not the file's values
    np.testing.assert_array_equal(weights.lm_head.weight, model.float_weight("lm_head.weight"))


def test_native_engine_refuses_naming_tensor_type_and_fix(tiny, tmp_path):
    from trtpipe.pipeline.recipe import parse_recipe
    from trtpipe.pipeline.stages.cpu import choose_cpu_backend
    from trtpipe.pipeline.stages.errors import BuildError
    from trtpipe.pipeline.stages.load import prepare_model

    path, _, model = tiny
    data = {
        "name": "tiny-q4km",
        "model": {"source": str(path)},
        "target": "cpu",
        "precision": {"prefill": "int4", "decode": "int4"},
        "kv_cache": {"block_size": 16, "num_blocks": 33, "dtype": "fp32"},
        "max_seq_len": 256,
        "max_batch_size": 2,
        "max_num_tokens": 128,
        "engine": {"cpu_backend": "native"},
    }
    from trtpipe.pipeline.model.weights import LoadedModel
    from trtpipe.pipeline.stages.native import native_support

    recipe = parse_recipe(data, origin="tiny.yaml")
    # a Q6_K head runs (I8 tiles, group 16: llama.cpp's Q4_0 / Q4_K_M files); a Q6_K embedding does
    # not (the kernels gather Q8 rows)
    assert native_support(recipe, prepare_model(recipe, model)) is None
    odd = LoadedModel(model.config, {**model.weights, "model.embed_tokens.weight": model.weights["lm_head.weight"]},
                      model.source_path, model.source_kind)  # fmt: skip
    prepared = prepare_model(recipe, odd)
    with pytest.raises(BuildError) as info:
        choose_cpu_backend(recipe, prepared, print)
    assert str(info.value) == (
        "engine.cpu_backend = native: model.embed_tokens.weight is GGUF Q6_K (native: Q8_0, Q5_0, Q4_0). "
        "Fix: set engine.cpu_backend: auto (or ort)."
    )
    lines: list[str] = []
    data["engine"] = {}
    assert choose_cpu_backend(parse_recipe(data, origin="tiny.yaml"), prepared, lines.append) is None
    assert len(lines) == 1 and "model.embed_tokens.weight is GGUF Q6_K (native: Q8_0, Q5_0, Q4_0)" in lines[0]


def test_decode_step_bytes_by_type_hand_computed(tiny, tmp_path):
    """Bytes = rows x blocks per row x block bytes (ggml-common.h): Q4_K 256x1x144, Q5_0
    128x8x22, Q8_0 128x8x34, Q5_K 256x1x176, Q5_1 512x8x24, Q4_0 512x8x18, Q6_K 256x2x210
    (ffn_down) + 32x1x210 (the head)."""
    _, _, model = tiny
    got = decode_step_bytes(model)
    assert got.bytes_by_type == (
        ("Q6_K", 107520 + 6720),
        ("Q5_1", 98304),
        ("Q4_0", 73728),
        ("Q5_K", 45056),
        ("Q4_K", 36864),
        ("Q8_0", 34816),
        ("Q5_0", 22528),
    )
    assert got.total_bytes == 425536
    assert got.summary().startswith("decode step reads 0.4 MiB of weights: Q6_K 0.1 MiB (27 %), Q5_1 0.1 MiB (23 %)")
    tied_path = tmp_path / "tied.gguf"
    _write_tiny(tied_path, tied=True)
    tied = decode_step_bytes(load_gguf(tied_path, with_tokenizer=False))
    assert dict(tied.bytes_by_type)["Q8_0"] == 34816 + 32 * 8 * 34  # v_proj + the tied Q8_0 embedding
    assert dict(tied.bytes_by_type)["Q6_K"] == 107520
    assert step_bytes_by_type([("F32", (2, 3)), ("F16", (4,))]) == GgufStepBytes((("F32", 24), ("F16", 8)))


def test_native_tiles_of_every_type_dequantize_to_the_file_s_values(tmp_path):
    """The native build's tiles (pipeline/stages/native.py: Q4 for Q4_0, Q8 for Q8_0 / Q5_0, I8 for
    the rest, fused q/k/v and gate/up of mixed types as I8) hold the GGUF file's values: each fused
    weight dequantizes (plugins/cpu/layout.dequantize) to gguf's dequantize of its parts, bit for
    bit (the tied file: a Q8_0 embedding the native engine takes)."""
    from trtpipe.pipeline.stages.native import _fused, native_tensors
    from trtpipe.plugins.cpu.layout import TiledI8, dequantize

    path = tmp_path / "tied.gguf"
    _write_tiny(path, tied=True)
    model = load_gguf(path, with_tokenizer=False)
    out = native_tensors(model)
    w = model.weights
    groups = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
              "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}  # fmt: skip
    for native_name, parts in groups.items():
        names = [f"model.layers.0.{p}.weight" for p in parts]
        fused = _fused(native_name, [w[n] for n in names])
        want = np.concatenate([model.float_weight(n) for n in names])
        np.testing.assert_array_equal(dequantize(fused).view(np.uint32), want.view(np.uint32), err_msg=native_name)
        np.testing.assert_array_equal(out[f"layers.0.{native_name}.codes"], fused.codes)
        assert isinstance(fused, TiledI8) == (f"layers.0.{native_name}.scale" in out)
    assert {k.split(".")[-1] for k in out if k.startswith("layers.0.down")} == {"codes", "scale"}  # Q6_K: G 16
    assert out["layers.0.down.scale"].size == 256 * 512 // 16
