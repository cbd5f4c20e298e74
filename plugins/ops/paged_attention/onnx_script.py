"""The torch exporter's translation of ``trtpipe::paged_attention`` into one
``trtpipe::PagedAttention`` node, built from the op's description (:mod:`trtpipe.plugins.ops.export`).
Imports onnxscript (build side only)."""

from __future__ import annotations

from trtpipe.plugins.ops.export import translation
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION

__all__ = ["paged_attention_onnx"]

paged_attention_onnx = translation(PAGED_ATTENTION)
