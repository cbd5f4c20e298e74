"""Native stage: the host CPU kernels' part of a cpu artifact (``engine.cpu_backend``).

From the GGUF blocks (never requantized) it writes ``native.bin`` (every tensor 64-byte aligned:
tile-interleaved Q4/Q8 weights, fp16 scales, fp32 norms; ``plugins/cpu/layout.py``) and the
kernel library compiled for the recipe's ``engine.cpu_isa`` (``plugins/cpu/compile.py``), and
returns the manifest's ``runtime_options.native`` record. The ONNX graphs are built beside it, so
the artifact still runs on ONNX Runtime (``--engine ort``).

What it takes (else :func:`native_support` says why not, and ``cpu_backend: auto`` builds the ONNX
Runtime engine only): a Llama model whose linears are GGUF Q4_1 or Q4_0 (group 32) and whose
embedding / LM head is GGUF Q8_0 (tied or not), any KV dtype (fp32, fp16, bf16, int8), no
attention bias, no RoPE scaling,
N % 16 == 0 and K % 32 == 0 for every linear.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trtpipe.pipeline.model.quantize import LINEAR_NAMES
from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.load import PreparedModel
from trtpipe.plugins.cpu.layout import TiledWeight, concat_rows, tile_q4, tile_q8
from trtpipe.plugins.ops.int4_gemm.layout import unpack_int4_codes
from trtpipe.plugins.ops.int4_gemm.pack import repack_gguf_q4_0, repack_gguf_q4_1_exact, repack_gguf_q8_0_as_uint8
from trtpipe.runtime.engines.native_weights import ALIGN, WEIGHTS_FILE

LIBRARY_FILE = "libtrtpipe_cpu.so"


def native_support(recipe: Recipe, model: PreparedModel) -> str | None:
    """None when the native engine can run ``model`` as ``recipe`` builds it, else the reason."""
    c, w = model.config, model.loaded.weights
    if recipe.precision.prefill != "int4" or recipe.precision.decode != "int4":
        return f"precision prefill={recipe.precision.prefill}, decode={recipe.precision.decode} (native: int4 both)"
    if c.attention_bias or c.rope_scaling:
        return "attention bias or RoPE scaling (native: plain Llama)"
    if c.non_llama_features():
        return f"{c.architecture} features {', '.join(c.non_llama_features())} (native: plain Llama)"
    linears = [f"model.layers.{i}.{p}.{n}.weight" for i in range(c.num_layers) for p, n in _parts()]
    odd = [n for n in linears if w[n].qtype not in ("Q4_0", "Q4_1")]
    if odd:
        types = ", ".join(sorted({w[n].qtype for n in odd}))
        return f"linear weights of GGUF type {types}, first {odd[0]} ({w[odd[0]].qtype}) (native: Q4_0 / Q4_1)"
    if recipe.precision.int4.group_size != 32:
        return f"int4 group size {recipe.precision.int4.group_size} (native: 32, the GGUF block)"
    for name in ("model.embed_tokens.weight", model.loaded.lm_head_name()):
        if w[name].qtype != "Q8_0":
            return f"{name} is GGUF {w[name].qtype} (native: Q8_0)"
    dims = [c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.vocab_size]
    if any(d % 32 for d in dims):
        return f"dimensions {dims} not all multiples of 32"
    if len(set(c.layer_num_kv_heads)) != 1:
        return "layers with different kv head counts"
    return None


def _parts() -> list[tuple[str, str]]:
    return [("self_attn" if n in LINEAR_NAMES[:4] else "mlp", n) for n in LINEAR_NAMES]


def _q4(t: WeightTensor, name: str) -> TiledWeight:
    N, K = t.shape
    if t.qtype == "Q4_1":
        packed, d, m = repack_gguf_q4_1_exact(t.data, N, K)
    else:  # Q4_0: w = d * (q - 8) = d * q + (-8 d), exact in fp16
        packed, d, _ = repack_gguf_q4_0(t.data, N, K)
        m = -8.0 * d
    return tile_q4(unpack_int4_codes(packed, K, N, 32), d, m, name)


def _q8(t: WeightTensor, name: str) -> TiledWeight:
    N, K = t.shape
    codes, d = repack_gguf_q8_0_as_uint8(t.data, N, K)
    return tile_q8(codes.reshape(N, K), d, name)


def native_tensors(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """Every tensor of ``native.bin`` by name (flat arrays): ``embed.*``, ``head.*`` (absent when
    tied to the embedding), ``final_norm``, ``layers.<i>.{attn_norm, mlp_norm, qkv.*, o.*,
    gate_up.*, down.*}`` with ``.codes`` uint8, ``.d`` / ``.m`` float16."""
    c, w = loaded.config, loaded.weights
    out: dict[str, np.ndarray] = {}

    def put(prefix: str, t: TiledWeight) -> None:
        out[f"{prefix}.codes"], out[f"{prefix}.d"] = t.codes, t.d
        if t.m is not None:
            out[f"{prefix}.m"] = t.m

    put("embed", _q8(w["model.embed_tokens.weight"], "model.embed_tokens.weight"))
    head = loaded.lm_head_name()
    if head != "model.embed_tokens.weight":
        put("head", _q8(w[head], head))
    out["final_norm"] = loaded.float_weight("model.norm.weight").astype(np.float32)
    for i in range(c.num_layers):
        p = f"model.layers.{i}"
        lin = {n: _q4(w[f"{p}.{part}.{n}.weight"], f"{p}.{part}.{n}") for part, n in _parts()}
        out[f"layers.{i}.attn_norm"] = loaded.float_weight(f"{p}.input_layernorm.weight").astype(np.float32)
        out[f"layers.{i}.mlp_norm"] = loaded.float_weight(f"{p}.post_attention_layernorm.weight").astype(np.float32)
        put(f"layers.{i}.qkv", concat_rows("qkv", [lin["q_proj"], lin["k_proj"], lin["v_proj"]]))
        put(f"layers.{i}.o", lin["o_proj"])
        put(f"layers.{i}.gate_up", concat_rows("gate_up", [lin["gate_proj"], lin["up_proj"]]))
        put(f"layers.{i}.down", lin["down_proj"])
    return out


def write_native(
    model: PreparedModel, out_dir: Path, isa: str, library: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Write ``native.bin`` and a copy of the kernel ``library`` (compiled for ``isa``) into
    ``out_dir``; returns the manifest's ``runtime_options.native`` (without activation levels,
    which are the recipe's)."""
    shutil.copyfile(library, out_dir / LIBRARY_FILE)
    tensors = native_tensors(model.loaded)
    table: dict[str, list[Any]] = {}
    offset = 0
    with open(out_dir / WEIGHTS_FILE, "wb") as f:
        for name, arr in tensors.items():
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(np.ascontiguousarray(arr).tobytes())
            table[name] = [arr.dtype.name, [int(arr.size)], offset]
            offset += arr.nbytes
    log(f"native engine: {len(tensors)} tensors, {offset / 2**20:.1f} MiB, kernels for {isa}")
    return {"isa": isa, "library": LIBRARY_FILE, "weights_file": WEIGHTS_FILE, "tensors": table}
