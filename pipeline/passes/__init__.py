"""Graph passes for the ONNX Runtime CPU backend: fuse the patterns the torch exporter emits into
ONNX Runtime's fused CPU kernels, so a decode step runs far fewer, larger nodes.

One file per pass (``rms_norm.py``, ``rotary.py``, ``int4_siblings.py``, ``silu.py``; shared
graph helpers in ``graph.py``). Each pass is a function ``ModelProto -> (ModelProto, count)``:
small, named, idempotent (a fused graph has no pattern left), tested before/after on a one-layer
graph (tests/pipeline/test_passes.py).

* :func:`fuse_rms_norm`: ``x * rsqrt(mean(x^2) + eps) * w`` (Pow, ReduceMean, Add, Sqrt,
  Reciprocal, Mul, Mul) -> ``SimplifiedLayerNormalization`` (ORT's RMSNorm kernel).
* :func:`fuse_rotary`: rotate-half RoPE (Reshape, Slice, Neg, Slice, Concat, Mul, Mul, Add,
  Reshape) with cos/sin gathered from a table by position -> ``com.microsoft::RotaryEmbedding``
  (interleaved=0), cos/sin caches = the first half of the tables' columns.
* :func:`fuse_int4_siblings`: ``trtpipe::Int4Gemm`` nodes that read the same activation (q/k/v,
  gate/up) -> one ``Int4Gemm`` over the row-concatenated weights + ``Split``: one larger kernel
  instead of several small ones (and, for float zero points, one mins term; plugins/ops/int4_gemm/lower_ort.py).
* :func:`merge_rotary_qk`: the q and k ``RotaryEmbedding`` of one layer, when both come from the
  same fused q/k/v ``Split`` -> one ``RotaryEmbedding`` over the q||k heads (the same rotation per
  head and position) + ``Split``.
* :func:`fuse_silu`: ``x * sigmoid(x)`` -> ``com.microsoft::QuickGelu(alpha=1)``.
"""

from __future__ import annotations

import onnx

from trtpipe.pipeline.passes.graph import MS, PassGraph, rebuild, toposort
from trtpipe.pipeline.passes.int4_siblings import fuse_int4_siblings
from trtpipe.pipeline.passes.rms_norm import fuse_rms_norm
from trtpipe.pipeline.passes.rotary import fuse_rotary, merge_rotary_qk
from trtpipe.pipeline.passes.silu import fuse_silu

__all__ = [
    "MS",
    "PassGraph",
    "rebuild",
    "toposort",
    "fuse_rms_norm",
    "fuse_rotary",
    "fuse_int4_siblings",
    "merge_rotary_qk",
    "fuse_silu",
    "optimize_for_ort",
]


def optimize_for_ort(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """All ORT CPU fusions, in order. Returns the model and how many of each were fused."""
    model, n_rms = fuse_rms_norm(model)
    model, n_rope = fuse_rotary(model)
    model, n_int4 = fuse_int4_siblings(model)
    model, n_qk = merge_rotary_qk(model)
    model, n_silu = fuse_silu(model)
    return model, {"rms_norm": n_rms, "rotary": n_rope, "int4_siblings": n_int4, "rotary_qk": n_qk, "silu": n_silu}
