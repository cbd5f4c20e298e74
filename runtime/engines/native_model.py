"""The native engine's model: the artifact's model description (manifest ``model``, a
:class:`~trtpipe.runtime.artifact.model_config.ModelConfig`) and ``native.bin`` made into the C
forward's ``tp_model`` (csrc/tp.h), every array's size checked against the description.

The description decides the program csrc/forward.c runs, layer by layer: which norms a layer has
(``norm_layout`` "pre": before attention and before the MLP; "sandwich": also on each output,
Gemma), QK-norm, the MLP activation, the window and the RoPE base of each layer, the embedding
scale, the softmax scale and the final logit soft-cap. Norm weights are stored in ``native.bin``
with ``norm_weight_offset`` already added (pipeline/stages/native.py), so C multiplies by them as
they are. A weight's kind follows from the arrays the tensor table holds for it: ``.scale`` (I8:
fp32 scales, and ``.offset`` where the type has offsets; GGUF k-quants, Q5_1, and fused groups of
mixed types), ``.m`` (Q4, GGUF Q4_0/Q4_1), else Q8 (GGUF Q8_0, and Q5_0 moved exactly). What the kernels cannot run (an
attention logit soft-cap, Gemma 2) is refused at load by name.

Raises :class:`ArtifactError` for a description the kernels cannot run, or weights and pool
sizes that disagree with it (a manifest edited or damaged: the kernels would read past them).
"""

from __future__ import annotations

import ctypes as C
from dataclasses import asdict

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.rope import rope_cos_sin
from trtpipe.plugins.cpu import library as L
from trtpipe.plugins.cpu.layout import TiledI8, TiledWeight
from trtpipe.runtime.artifact.manifest import Manifest
from trtpipe.runtime.engines.native_weights import NativeWeights
from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.kv.pool import KVPool

ACTIVATIONS = {"silu": L._C["TP_ACT_SILU"], "gelu_tanh": L._C["TP_ACT_GELU_TANH"]}
UNSUPPORTED = ("attn_logit_softcap",)  # ModelConfig family fields the C forward does not run


class NativeModel:
    """``tp_model`` of an artifact (``.struct``) and the arrays it points into (kept alive)."""

    def __init__(self, manifest: Manifest, weights: NativeWeights, pool: KVPool, max_positions: int):
        self.manifest, self.weights, self.pool = manifest, weights, pool
        self.max_positions = max_positions
        self._rebuild = manifest.rebuild_command
        self._check_description()
        self._tables: dict[tuple[float, bool], tuple[np.ndarray, np.ndarray]] = {}
        self.struct = self._model()

    def _refuse(self, what: str) -> ArtifactError:
        return ArtifactError(f"artifact {self.manifest.root}: {what}. Fix: `{self._rebuild}`.")

    def facts(self) -> str:
        c = self.manifest.model
        return (
            f"hidden_size {c.hidden_size}, num_heads {c.num_heads}, num_kv_heads {c.num_kv_heads}, "
            f"head_dim {c.head_dim}, intermediate_size {c.intermediate_size}, vocab_size {c.vocab_size}"
        )

    def _check_description(self) -> None:
        c = self.manifest.model
        if c.num_kv_heads < 1 or c.num_heads % c.num_kv_heads or c.head_dim % 16:
            raise self._refuse(
                f"model facts {self.facts()}: the kernels need num_heads a multiple of num_kv_heads >= 1 "
                "and head_dim % 16 == 0"
            )
        if len(set(c.layer_num_kv_heads)) != 1:
            raise self._refuse(f"layer_num_kv_heads {sorted(set(c.layer_num_kv_heads))}: the kernels take one count")
        odd = [f for f in UNSUPPORTED if getattr(c, f)]
        if odd or c.activation not in ACTIVATIONS:
            raise self._refuse(
                f"the model ({c.architecture}) has {', '.join(odd) or f'activation {c.activation}'}, which the "
                "native kernels do not run; run it with --engine ort"
            )

    def _tensor(self, name: str, count: int) -> np.ndarray:
        return self.weights.tensor(name, count, self.facts())

    def _norm(self, name: str, count: int):
        """A pointer to norm ``name``, or NULL when the table has none (a norm the layer lacks)."""
        return L.ptr(self._tensor(name, count), L._f32p) if self.weights.has(name) else L._f32p()

    def weight(self, prefix: str, N: int, K: int) -> C.Structure:
        """The tiled weight ``prefix`` of [N, K] (kind from its arrays), sizes checked against N x K."""
        if N % 16 or K % 32 or N <= 0 or K <= 0:
            raise self._refuse(
                f"{prefix} is [{N}, {K}] by the manifest's model facts ({self.facts()}); the kernels need "
                "N % 16 == 0 and K % 32 == 0"
            )
        if self.weights.has(f"{prefix}.scale"):  # I8: fp32 scales (and offsets) per group of 32 or 16
            codes = self._tensor(f"{prefix}.codes", N * K)
            groups = self.weights.tensor(f"{prefix}.scale").size
            G = N * K // groups if groups else 0
            if G not in (16, 32) or G * groups != N * K:
                raise self._refuse(f"{prefix}.scale holds {groups} values: not N x K / 16 or / 32 ({self.facts()})")
            offset = self._tensor(f"{prefix}.offset", groups) if self.weights.has(f"{prefix}.offset") else None
            return L.weight_struct(TiledI8(N, K, G, codes, self._tensor(f"{prefix}.scale", groups), offset))
        kind = "q4" if self.weights.has(f"{prefix}.m") else "q8"
        codes = self._tensor(f"{prefix}.codes", N * K // (2 if kind == "q4" else 1))
        d = self._tensor(f"{prefix}.d", N * K // 32)
        m = self._tensor(f"{prefix}.m", N * K // 32) if kind == "q4" else None
        return L.weight_struct(TiledWeight(kind, N, K, codes, d, m))

    def kv(self, layer: int) -> C.Structure:
        """Layer ``layer``'s pool (any KV dtype; int8 with its scales), its shape checked."""
        p, c, kv = self.pool, self.manifest.model, self.manifest.kv
        want = (c.num_kv_heads, kv.num_blocks, kv.block_size, c.head_dim)
        if p.keys[layer].shape != want or p.values[layer].shape != want:
            raise self._refuse(
                f"layer {layer}'s KV pool is {p.keys[layer].shape}; the manifest says [num_kv_heads, "
                f"num_blocks, block_size, head_dim] = {list(want)}"
            )
        scales = (p.key_scales[layer], p.value_scales[layer]) if p.key_scales else (None, None)
        try:
            return L.kv_struct(p.keys[layer], p.values[layer], *scales)
        except OpError as e:
            raise ArtifactError(f"{e}. Fix: `{self._rebuild}`.") from e

    def rope_tables(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin ``[max_positions, head_dim]`` of layer ``layer``'s RoPE base (shared by layers
        of the same base and scaling)."""
        c = self.manifest.model
        theta, scaled = c.layer_rope(layer)
        key = (float(theta), bool(scaled and c.rope_scaling is not None))
        if key not in self._tables:
            scaling = asdict(c.rope_scaling) if key[1] and c.rope_scaling is not None else None
            self._tables[key] = rope_cos_sin(self.max_positions, c.head_dim, theta, scaling)
        return self._tables[key]

    def _layer(self, i: int) -> C.Structure:
        c = self.manifest.model
        H, KVH, D, Hd, F = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.intermediate_size
        p = f"layers.{i}"
        cos, sin = self.rope_tables(i)
        return L.Layer(
            L.ptr(self._tensor(f"{p}.attn_norm", Hd), L._f32p),
            L.ptr(self._tensor(f"{p}.mlp_norm", Hd), L._f32p),
            self._norm(f"{p}.post_attn_norm", Hd), self._norm(f"{p}.post_mlp_norm", Hd),
            self._norm(f"{p}.q_norm", D), self._norm(f"{p}.k_norm", D),
            self.weight(f"{p}.qkv", (H + 2 * KVH) * D, Hd), self.weight(f"{p}.o", Hd, H * D),
            self.weight(f"{p}.gate_up", 2 * F, Hd), self.weight(f"{p}.down", Hd, F),
            self.kv(i), int(c.layer_sliding_window[i]),
            L.ptr(cos, L._f32p), L.ptr(sin, L._f32p),
        )  # fmt: skip

    def _model(self) -> C.Structure:
        c, kv = self.manifest.model, self.manifest.kv
        Hd = c.hidden_size
        self._layers = (L.Layer * c.num_layers)(*(self._layer(i) for i in range(c.num_layers)))
        embed = self.weight("embed", c.vocab_size, Hd)
        head = self.weight("head", c.vocab_size, Hd) if self.weights.has("head.codes") else embed
        return L.Model(
            c.num_layers, Hd, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size,
            kv.num_blocks, kv.block_size, self.max_positions, ACTIVATIONS[c.activation],
            c.rms_norm_eps, c.softmax_scale, c.embedding_scale, c.final_logit_softcap,
            embed, L.ptr(self._tensor("final_norm", Hd), L._f32p), head, self._layers,
        )  # fmt: skip
