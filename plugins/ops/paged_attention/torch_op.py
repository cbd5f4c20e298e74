"""torch custom op ``trtpipe::paged_attention`` (for ``torch.onnx.export(dynamo=True)``), with
the schema built from the op's description (:data:`~trtpipe.plugins.ops.paged_attention.spec.PAGED_ATTENTION`).

Meaning: docs/contracts.md and :mod:`trtpipe.plugins.ops.paged_attention.reference` (the NumPy
definition). The eager body is a torch implementation of the same meaning (a per-sequence loop; a
reference, not a fast path). Ops that mutate inputs do not export (TOOLCHAIN.md), so the op
returns the updated caches as new tensors; backends alias them in place.

Importing this module imports torch: only the build side (``trtpipe.pipeline``) does so.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION

__all__ = ["paged_attention"]


def _paged_attention(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paged GQA attention; see docs/contracts.md. Shapes: query [T, H*D], key/value [T, KVH*D],
    caches [KVH, NB, BS, D] (head-major), slot_mapping [T], block_tables [S, MB], context_lens [S],
    query_start_loc [S+1] (int64); key_scale / value_scale None (the exporter writes float pools:
    an int8 pool and its scales appear when a lowering retypes the pool). Returns
    (output [T, H*D], key_cache_out, value_cache_out)."""
    a = PAGED_ATTENTION.bind(args, kwargs, style="positional")
    if a.key_scale is not None or a.value_scale is not None:
        raise ValueError("trtpipe::paged_attention (torch): float pools only; int8 pools exist in lowered graphs")
    query, KVH, D, bs_attr = a.query, a.num_kv_heads, a.head_size, a.block_size
    T = query.shape[0]
    kc = a.key_cache.clone()
    vc = a.value_cache.clone()
    nb, bs = kc.shape[1], kc.shape[2]
    kc.view(KVH, nb * bs, D)[:, a.slot_mapping] = a.key.view(T, KVH, D).transpose(0, 1).to(kc.dtype)
    vc.view(KVH, nb * bs, D)[:, a.slot_mapping] = a.value.view(T, KVH, D).transpose(0, 1).to(vc.dtype)
    scale = a.scale if a.scale != 0.0 else 1.0 / math.sqrt(D)
    group = a.num_heads // KVH
    out = torch.empty(T, a.num_heads, D, dtype=query.dtype)
    q_all = query.view(T, a.num_heads, D).float()
    qsl = a.query_start_loc.tolist()
    for s in range(len(qsl) - 1):
        t0, t1 = qsl[s], qsl[s + 1]
        if t1 == t0:
            continue
        L = int(a.context_lens[s])
        j = torch.arange(L)
        slots = a.block_tables[s, j // bs_attr] * bs_attr + j % bs_attr
        k = kc.view(KVH, nb * bs, D)[:, slots].transpose(0, 1).float()  # [L, KVH, D]
        v = vc.view(KVH, nb * bs, D)[:, slots].transpose(0, 1).float()
        k = k.repeat_interleave(group, dim=1)  # [L, H, D]
        v = v.repeat_interleave(group, dim=1)
        q = q_all[t0:t1]  # [n, H, D]
        pos = L - (t1 - t0) + torch.arange(t1 - t0)
        visible = j[None, :] <= pos[:, None]
        if a.sliding_window > 0:
            visible &= j[None, :] > pos[:, None] - a.sliding_window
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[t0:t1] = torch.einsum("hnl,lhd->nhd", probs, v).to(query.dtype)
    return out.view(T, a.num_heads * D), kc, vc


paged_attention = torch.library.custom_op(
    f"trtpipe::{PAGED_ATTENTION.torch_name}", _paged_attention, mutates_args=(), schema=PAGED_ATTENTION.torch_schema()
)


@paged_attention.register_fake
def _paged_attention_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = PAGED_ATTENTION.bind(args, kwargs, style="positional")
    return torch.empty_like(a.query), torch.empty_like(a.key_cache), torch.empty_like(a.value_cache)
