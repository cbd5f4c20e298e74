"""The torch exporter's translation of ``trtpipe::int4_gemm`` into one ``trtpipe::Int4Gemm``
node, built from the op's description (:mod:`trtpipe.plugins.ops.export`). Imports onnxscript
(build side only)."""

from __future__ import annotations

from trtpipe.plugins.ops.export import translation
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM

__all__ = ["int4_gemm_onnx"]

int4_gemm_onnx = translation(INT4_GEMM)
