"""The reference decoder in torch, written for export: one forward program driven by the
:class:`~trtpipe.runtime.artifact.model_config.ModelConfig` description (Llama, Mistral, Qwen2/3,
Gemma 2/3: :mod:`trtpipe.pipeline.model.families`), no per-family classes.

Two forward paths share every weight and the layer body (:meth:`DecoderLayer.run`):

* :meth:`ReferenceModel.forward_dense` — ``input_ids [B, L]`` -> logits ``[B, L, V]``, plain causal
  (and windowed) attention; checked against transformers (tests/pipeline/test_model_vs_transformers.py).
* :meth:`ReferenceModel.forward_paged` — the packed, paged form that is exported to ONNX
  (docs/contracts.md "Graph I/O"): attention through ``trtpipe::paged_attention`` over the KV pool
  (per-layer window and scale), linears through ``trtpipe::int4_gemm`` for INT4 weights, logits
  only for each sequence's last token. The op has no attention-logit soft-cap, so a model with
  one (Gemma 2) is refused there (:class:`OpError` naming it) rather than run without it.

RoPE: one cos/sin table per distinct (base, scaled) pair of ``layer_rope_theta`` /
``layer_rope_scaled`` (Gemma 3: local and global); the first is ``rope_cos`` / ``rope_sin``, others
``rope_cos_1``... (Llama: one table, the exported graph unchanged).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import trtpipe.plugins.ops.torch_ops  # noqa: F401  (registers torch.ops.trtpipe.*)
from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.pipeline.model.quantize import ModelWeights, QuantSpec, quantize_model
from trtpipe.pipeline.model.reference.layers import Attention, DecoderLayer
from trtpipe.pipeline.model.reference.linears import frozen_param, make_linear
from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.rope import rope_cos_sin
from trtpipe.runtime.artifact.model_config import ModelConfig


def paged_refusal(c: ModelConfig) -> str | None:
    """Why ``trtpipe::paged_attention`` cannot run ``c`` (None when it can): the op has no
    attention-logit soft-cap input."""
    if c.attn_logit_softcap:
        return (
            f"attn_logit_softcap = {c.attn_logit_softcap} ({c.architecture}): trtpipe::paged_attention has no "
            "attention-logit soft-cap, so the exported graph cannot run this model. Fix: build another "
            "family, or add a softcap attribute to the paged_attention op (all lowerings and kernels)."
        )
    return None


class ReferenceModel(nn.Module):
    """The reference decoder. Build with :func:`build_reference_model`.

    ``rope_table_len`` sets the cos/sin table length (default: the model's context length);
    positions at or beyond it raise :class:`OpError` in eager mode (never a silent wrap).
    ``sliding_window``: the recipe's override of every layer's window
    (:func:`~trtpipe.pipeline.model.overrides.with_sliding_window`; None keeps the model's).
    """

    def __init__(
        self,
        model: LoadedModel,
        weights: ModelWeights,
        rope_table_len: int | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        c = with_sliding_window(model.config, sliding_window)
        if c is not model.config:
            model = replace(model, config=c)
        self.config: ModelConfig = c
        self.quant = weights.quant
        self.embed_tokens = frozen_param(model.float_weight("model.embed_tokens.weight"))
        self.layers = nn.ModuleList(DecoderLayer(model, i, weights) for i in range(c.num_layers))
        self.norm = DecoderLayer.final_norm(model)
        # None: tied to embed_tokens (one initializer in the graph)
        self.lm_head = None if weights.lm_head is None else make_linear(weights.lm_head)
        self._rope_tables(rope_table_len or c.max_position_embeddings)

    def _rope_tables(self, n: int) -> None:
        """One cos/sin table [n, head_dim] per distinct (base, scaled) of the layers (module docstring)."""
        c = self.config
        per_layer = [c.layer_rope(i) for i in range(c.num_layers)]
        keys = list(dict.fromkeys(per_layer)) or [(float(c.rope_theta), True)]
        self.rope_index = [keys.index(k) for k in per_layer]
        for t, (theta, scaled) in enumerate(keys):
            scaling = asdict(c.rope_scaling) if scaled and c.rope_scaling is not None else None
            cos, sin = rope_cos_sin(n, c.head_dim, theta, scaling)
            suffix = f"_{t}" if t else ""
            self.register_buffer("rope_cos" + suffix, torch.from_numpy(np.ascontiguousarray(cos, np.float32)))
            self.register_buffer("rope_sin" + suffix, torch.from_numpy(np.ascontiguousarray(sin, np.float32)))

    # -- helpers ---------------------------------------------------------------------------
    def _rope_at(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) rows at ``positions`` for each table (gathered once, shared by its layers)."""
        n = max(self.rope_index, default=0) + 1
        suffixes = ["_" + str(t) if t else "" for t in range(n)]
        return [(getattr(self, "rope_cos" + x)[positions], getattr(self, "rope_sin" + x)[positions]) for x in suffixes]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [..., hidden], times ``embedding_scale`` rounded to the table's dtype
        (HF Gemma3TextScaledWordEmbedding)."""
        h = F.embedding(input_ids, self.embed_tokens)
        scale = self.config.embedding_scale
        return h if scale == 1.0 else h * torch.tensor(scale, dtype=self.embed_tokens.dtype)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        logits = F.linear(h, self.embed_tokens) if self.lm_head is None else self.lm_head(h)
        cap = self.config.final_logit_softcap
        return logits if not cap else torch.tanh(logits / cap) * cap

    def _check_positions(self, positions: torch.Tensor) -> None:
        n = self.rope_cos.shape[0]
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n):
            raise OpError(
                f"positions must be in [0, {n}) (the RoPE table length); got min {int(positions.min())}, "
                f"max {int(positions.max())}. Fix: raise max_seq_len in the recipe (up to the model's context)."
            )

    # -- dense path (parity with transformers) ------------------------------------------------
    @torch.no_grad()
    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, L] int64 -> logits [B, L, V] float32 (all positions)."""
        pos = torch.arange(input_ids.shape[1])
        self._check_positions(pos)
        tables = self._rope_at(pos)
        h = self._embed(input_ids)
        for li, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_index[li]]

            def attend(a: Attention, x: torch.Tensor, cos=cos, sin=sin) -> torch.Tensor:
                return a.dense(*a.project(x, cos, sin))

            h = layer.run(h, attend)
        return self._logits(h)

    # -- paged path (exported) ---------------------------------------------------------------
    def forward_paged(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        slot_mapping: torch.Tensor,  # [T] int64
        block_tables: torch.Tensor,  # [S, MB] int64
        context_lens: torch.Tensor,  # [S] int64
        query_start_loc: torch.Tensor,  # [S+1] int64
        last_token_indices: torch.Tensor,  # [S] int64
        kv_caches: list[torch.Tensor],  # 2 per layer: K, V [KVH_i, NB, BS, D] (head-major)
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Packed ragged batch over the paged KV pool -> (logits [S, V], updated caches).
        Raises :class:`OpError` for a model the paged op cannot run (:func:`paged_refusal`)."""
        why = paged_refusal(self.config)
        if why:
            raise OpError(why)
        T = input_ids.shape[0]
        tables = self._rope_at(positions)
        h = self._embed(input_ids)
        new_caches: list[torch.Tensor] = []
        for li, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_index[li]]
            kc, vc = kv_caches[2 * li], kv_caches[2 * li + 1]
            out: list[torch.Tensor] = []

            def attend(a: Attention, x: torch.Tensor, cos=cos, sin=sin, kc=kc, vc=vc, out=out) -> torch.Tensor:
                q, k, v = a.project(x, cos, sin)
                o, kc2, vc2 = torch.ops.trtpipe.paged_attention(
                    q.reshape(T, -1),
                    k.reshape(T, -1),
                    v,
                    kc,
                    vc,
                    slot_mapping,
                    block_tables,
                    context_lens,
                    query_start_loc,
                    None,  # key_scale, value_scale: the exported pool is float (lowerings may retype it)
                    None,
                    a.num_heads,
                    a.num_kv_heads,
                    a.head_dim,
                    a.scale,
                    kc.shape[2],  # block_size: the pool is [KVH, NB, BS, D]
                    a.sliding_window,
                )
                out += [kc2, vc2]
                return o

            h = layer.run(h, attend)
            new_caches += out
        h_last = h[last_token_indices]
        return self._logits(h_last), new_caches

    @torch.no_grad()
    def run_paged(
        self,
        input_ids,
        positions,
        slot_mapping,
        block_tables,
        context_lens,
        query_start_loc,
        last_token_indices,
        kv_caches,
    ):
        """Eager call of :meth:`forward_paged` with position checks (numpy or torch inputs)."""
        t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.int64)  # noqa: E731
        positions = t(positions)
        self._check_positions(positions)
        return self.forward_paged(
            t(input_ids),
            positions,
            t(slot_mapping),
            t(block_tables),
            t(context_lens),
            t(query_start_loc),
            t(last_token_indices),
            kv_caches,
        )


def build_reference_model(
    model: LoadedModel,
    precision: str = "fp32",
    group_size: int = 32,
    symmetric: bool = False,
    *,
    lm_head_quant: QuantSpec | None = None,
    weights: ModelWeights | None = None,
    **kw,
) -> ReferenceModel:
    """Reference model of a loaded checkpoint at a weight precision ("fp32" or "int4"): its
    linears prepared first (:func:`~trtpipe.pipeline.model.quantize.quantize_model`, or the
    ``weights`` the load stage prepared), then the torch modules built over them."""
    if weights is None:
        weights = quantize_model(model, QuantSpec(precision, group_size, symmetric), lm_head_quant)
    return ReferenceModel(model, weights, **kw).eval()


LlamaReference = ReferenceModel  # the name callers used before the families (issue 42)
