"""Native stage: the host CPU kernels' part of a cpu artifact (``engine.cpu_backend``).

From the GGUF blocks (never requantized) it writes ``native.bin`` (every tensor 64-byte aligned:
tile-interleaved Q4/Q8 weights, fp16 scales, fp32 norms; ``plugins/cpu/layout.py``) and the
kernel library compiled for the recipe's ``engine.cpu_isa`` (``plugins/cpu/compile.py``), and
returns the manifest's ``runtime_options.native`` record. The ONNX graphs are built beside it, so
the artifact still runs on ONNX Runtime (``--engine ort``).

What it takes (else :func:`native_support` says why not, and ``cpu_backend: auto`` builds the ONNX
Runtime engine only): a decoder whose description (ModelConfig) the C forward runs (Llama, Qwen3,
Gemma 3: norm layout, QK-norm, activation, per-layer window and RoPE base, embedding and softmax
scales, final soft-cap; not an attention soft-cap), whose linears are GGUF blocks of any type
gguf_blocks decodes (Q4_0 / Q4_1 into Q4 tiles, Q8_0 / Q5_0 into Q8 tiles, Q5_1 / Q4_K / Q5_K /
Q6_K into I8 tiles with fp32 scales; a fused group (q/k/v, gate/up) of mixed kinds becomes I8,
except Q6_K beside a type with offsets), whose embedding is GGUF Q8_0, Q5_0 or Q4_0 (the kernels
gather Q8 rows: Q4_0's codes q - 8 and Q5_0's q - 16 are Q8 codes with the same fp16 d, exactly),
whose untied LM head is any of those linear types (llama.cpp's Q4_0 files: a Q6_K head),
any KV dtype (fp32, fp16, bf16, int8), no attention bias, no RoPE scaling, N % 16 == 0 and
K % 32 == 0 for every linear.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trtpipe.pipeline.model.quantize import LINEAR_NAMES
from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.load import PreparedModel
from trtpipe.plugins.core.gguf_blocks import GGUF_BLOCK_TYPES, decode_blocks
from trtpipe.plugins.cpu.isa import ACT_FORM
from trtpipe.plugins.cpu.layout import Tiled, TiledI8, TiledWeight, concat_rows, tile_i8, tile_q4, tile_q8
from trtpipe.plugins.ops.int4_gemm.layout import unpack_int4_codes
from trtpipe.plugins.ops.int4_gemm.pack import repack_gguf_q4_0, repack_gguf_q4_1_exact, repack_gguf_q8_0_as_uint8
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.engines.native_weights import ALIGN, WEIGHTS_FILE

LIBRARY_FILE = "libtrtpipe_cpu.so"


# linear weight types and the tiles they move into, exactly: Q4 (Q4_0, Q4_1), Q8 (Q8_0; Q5_0's codes
# q - 16 are Q8 codes u - 128 with u = q + 112, the same fp16 scale), I8 (every other GGUF block type:
# fp32 scales and offsets per group of 32, 16 for Q6_K; plugins/core/gguf_blocks' kernel form)
Q4_TYPES, Q8_TYPES = ("Q4_0", "Q4_1"), ("Q8_0", "Q5_0")
I8_TYPES = tuple(t for t in GGUF_BLOCK_TYPES if t not in Q4_TYPES + Q8_TYPES)
ASYMMETRIC = ("Q4_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K")  # as tiled here: an offset per group
EMBED_TYPES = ("Q8_0", "Q5_0", "Q4_0")  # gathered from Q8 tiles (tp_embed_q8), exactly
# ModelConfig family fields the C forward runs (csrc/forward.c); the rest are refused by name
NATIVE_FAMILY_FIELDS = frozenset(
    {"layer_rope_theta", "layer_rope_scaled", "norm_layout", "norm_weight_offset", "qk_norm", "activation",
     "embedding_scale", "attention_scale", "final_logit_softcap"}
)  # fmt: skip
FUSED = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def _linear_kinds(c: ModelConfig, w: dict[str, WeightTensor]) -> str | None:
    """None when every linear is a GGUF block type the kernels read and each fused group (q/k/v,
    gate/up) has an exact common layout (not Q6_K's group of 16 beside a type with offsets), else
    the reason."""
    for i in range(c.num_layers):
        for group in FUSED:
            names = [f"model.layers.{i}.{'self_attn' if n in LINEAR_NAMES[:4] else 'mlp'}.{n}.weight" for n in group]
            types = [w[n].qtype for n in names]
            odd = [(n, t) for n, t in zip(names, types, strict=True) if t not in Q4_TYPES + Q8_TYPES + I8_TYPES]
            if odd:
                return f"linear weights of GGUF type {odd[0][1]}, first {odd[0][0]} (native: GGUF block types)"
            if "Q6_K" in types and any(t in ASYMMETRIC for t in types):
                return f"{', '.join(names)} fuse Q6_K (group 16) with a type with offsets {types} (no exact layout)"
    return None


def native_support(recipe: Recipe, model: PreparedModel) -> str | None:
    """None when the native engine can run ``model`` as ``recipe`` builds it, else the reason."""
    c, w = model.config, model.loaded.weights
    if recipe.precision.prefill != "int4" or recipe.precision.decode != "int4":
        return f"precision prefill={recipe.precision.prefill}, decode={recipe.precision.decode} (native: int4 both)"
    if c.attention_bias or c.rope_scaling:
        return "attention bias or RoPE scaling (native: no bias, no scaling)"
    odd_family = sorted(set(c.non_llama_features()) - NATIVE_FAMILY_FIELDS)
    if odd_family:
        return f"{c.architecture} model facts {', '.join(odd_family)} (the native forward does not run them)"
    reason = _linear_kinds(c, w)
    if reason:
        return reason
    if recipe.precision.int4.group_size != 32:
        return f"int4 group size {recipe.precision.int4.group_size} (native: 32, the GGUF block)"
    if w["model.embed_tokens.weight"].qtype not in EMBED_TYPES:
        return f"model.embed_tokens.weight is GGUF {w['model.embed_tokens.weight'].qtype} (native: {', '.join(EMBED_TYPES)})"
    head = model.loaded.lm_head_name()
    if w[head].qtype not in Q4_TYPES + Q8_TYPES + I8_TYPES:
        return f"{head} is GGUF {w[head].qtype} (native: a GGUF block type)"
    dims = [c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.vocab_size]
    if any(d % 32 for d in dims):
        return f"dimensions {dims} not all multiples of 32"
    if len(set(c.layer_num_kv_heads)) != 1:
        return "layers with different kv head counts"
    return None


def _parts() -> list[tuple[str, str]]:
    return [("self_attn" if n in LINEAR_NAMES[:4] else "mlp", n) for n in LINEAR_NAMES]


def _fused(name: str, parts: list[WeightTensor]) -> Tiled:
    """Linears of one input stacked along N (q/k/v, gate/up; or one alone) in one layout: Q4 or Q8
    when every part is of that kind, else I8 from gguf_blocks' kernel form of each part (bit for
    bit gguf's values, signed zeros included: Q4_0 through Q4 tiles is d q + (-8 d), +0.0 where
    gguf has d (q - 8) = -0.0 for a negative d)."""
    kinds = {"q4" if t.qtype in Q4_TYPES else "q8" if t.qtype in Q8_TYPES else "i8" for t in parts}
    if kinds != {"i8"} and len(kinds) == 1:
        return concat_rows(name, [_linear(t, t.name) for t in parts])
    return concat_rows(name, [tile_i8(decode_blocks(t.data, t.qtype), t.name) for t in parts])


def _linear(t: WeightTensor, name: str) -> Tiled:
    """A linear's GGUF blocks moved into the kernels' layout, exactly (Q4: Q4_0 / Q4_1; Q8: Q8_0 /
    Q5_0; I8: the other types, through plugins/core/gguf_blocks' exact decode)."""
    N, K = t.shape
    if t.qtype in I8_TYPES:
        return tile_i8(decode_blocks(t.data, t.qtype), name)
    if t.qtype in Q8_TYPES:
        kb = decode_blocks(t.data, t.qtype)  # codes int8 in -128..127, scales = the fp16 d as fp32
        return tile_q8((kb.codes.astype(np.int16) + 128).astype(np.uint8), kb.scales.astype(np.float16), name)
    if t.qtype == "Q4_1":
        packed, d, m = repack_gguf_q4_1_exact(t.data, N, K)
    else:  # Q4_0: w = d * (q - 8) = d * q + (-8 d), exact in fp16
        packed, d, _ = repack_gguf_q4_0(t.data, N, K)
        m = -8.0 * d
    return tile_q4(unpack_int4_codes(packed, K, N, 32), d, m, name)


def _q8(t: WeightTensor, name: str) -> TiledWeight:
    """An embedding (and a Q8_0 head) as Q8 tiles: Q8_0 repacked, Q5_0 / Q4_0 through their exact
    Q8 codes (:func:`_linear`'s Q8 path, which decodes Q4_0 the same way)."""
    N, K = t.shape
    if t.qtype != "Q8_0":
        kb = decode_blocks(t.data, t.qtype)  # codes q - 8 (Q4_0) / q - 16 (Q5_0), scales the fp16 d
        return tile_q8((kb.codes.astype(np.int16) + 128).astype(np.uint8), kb.scales.astype(np.float16), name)
    codes, d = repack_gguf_q8_0_as_uint8(t.data, N, K)
    return tile_q8(codes.reshape(N, K), d, name)


def _norms(loaded: LoadedModel, i: int) -> dict[str, np.ndarray]:
    """Layer ``i``'s norms under their native names, ``norm_weight_offset`` added (fp32, as the
    reference multiplies by ``offset + w``): attn_norm, mlp_norm, and where the description has
    them post_attn_norm, post_mlp_norm (sandwich), q_norm, k_norm (QK-norm)."""
    c, p = loaded.config, f"model.layers.{i}"
    names = {"attn_norm": "input_layernorm"}
    if c.norm_layout == "sandwich":
        names |= {"post_attn_norm": "post_attention_layernorm", "mlp_norm": "pre_feedforward_layernorm",
                  "post_mlp_norm": "post_feedforward_layernorm"}  # fmt: skip
    else:
        names["mlp_norm"] = "post_attention_layernorm"
    if c.qk_norm:
        names |= {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
    off = np.float32(c.norm_weight_offset)
    return {k: loaded.float_weight(f"{p}.{v}.weight").astype(np.float32) + off for k, v in names.items()}


def iter_native_tensors(loaded: LoadedModel) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of ``native.bin`` in file order, ``(name, flat array)``, made one weight at
    a time (a layer's tiles are never all held: the writer streams them, issue 44): ``embed.*``,
    ``head.*`` (absent when tied to the embedding), ``final_norm``, ``layers.<i>.{attn_norm,
    mlp_norm, qkv.*, o.*, gate_up.*, down.*}`` and the norms the description adds
    (``post_attn_norm``, ``post_mlp_norm``, ``q_norm``, ``k_norm``), with ``.codes`` uint8, ``.d``
    / ``.m`` float16 (``.m``: a Q4 weight) or ``.scale`` / ``.offset`` float32 (an I8 weight),
    norms float32 with ``norm_weight_offset`` added."""
    c, w = loaded.config, loaded.weights

    def parts(prefix: str, t: Tiled) -> Iterator[tuple[str, np.ndarray]]:
        yield f"{prefix}.codes", t.codes
        if isinstance(t, TiledI8):  # fp32 scales, offsets only where the type has them
            yield f"{prefix}.scale", t.scale
            if t.offset is not None:
                yield f"{prefix}.offset", t.offset
            return
        yield f"{prefix}.d", t.d
        if t.m is not None:
            yield f"{prefix}.m", t.m

    yield from parts("embed", _q8(w["model.embed_tokens.weight"], "model.embed_tokens.weight"))
    head = loaded.lm_head_name()
    if head != "model.embed_tokens.weight":  # a Q8_0 head as before; other types as a linear's tiles
        yield from parts("head", _q8(w[head], head) if w[head].qtype == "Q8_0" else _linear(w[head], head))
    yield "final_norm", loaded.float_weight("model.norm.weight").astype(np.float32) + np.float32(c.norm_weight_offset)
    for i in range(c.num_layers):
        p = f"model.layers.{i}"
        lin = {n: w[f"{p}.{part}.{n}.weight"] for part, n in _parts()}
        yield from ((f"layers.{i}.{k}", v) for k, v in _norms(loaded, i).items())
        yield from parts(f"layers.{i}.qkv", _fused("qkv", [lin["q_proj"], lin["k_proj"], lin["v_proj"]]))
        yield from parts(f"layers.{i}.o", _fused("o", [lin["o_proj"]]))
        yield from parts(f"layers.{i}.gate_up", _fused("gate_up", [lin["gate_proj"], lin["up_proj"]]))
        yield from parts(f"layers.{i}.down", _fused("down", [lin["down_proj"]]))


def native_tensors(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """:func:`iter_native_tensors` as one dict (every tensor held: for tests and small models)."""
    return dict(iter_native_tensors(loaded))


def write_native(
    model: PreparedModel, out_dir: Path, isa: str, library: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Write ``native.bin`` and a copy of the kernel ``library`` (compiled for ``isa``) into
    ``out_dir``; returns the manifest's ``runtime_options.native`` (without activation levels,
    which are the recipe's), with the form the library holds ``levels: 2`` in (the ISA's,
    ``plugins/cpu/isa.py`` ACT_FORM, as ``compile_library`` builds it)."""
    shutil.copyfile(library, out_dir / LIBRARY_FILE)
    table: dict[str, list[Any]] = {}
    offset = 0
    with open(out_dir / WEIGHTS_FILE, "wb") as f:
        for name, arr in iter_native_tensors(model.loaded):  # each written as made, then dropped
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(np.ascontiguousarray(arr).data)
            table[name] = [arr.dtype.name, [int(arr.size)], offset]
            offset += arr.nbytes
    log(f"native engine: {len(table)} tensors, {offset / 2**20:.1f} MiB, kernels for {isa} ({ACT_FORM[isa]})")
    native = {"isa": isa, "activation_form": ACT_FORM[isa], "library": LIBRARY_FILE, "weights_file": WEIGHTS_FILE}
    return native | {"tensors": table}
