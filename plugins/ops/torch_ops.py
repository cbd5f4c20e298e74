"""The torch side of every ``trtpipe`` op, for ``torch.onnx.export(dynamo=True)``: importing this
module registers the custom ops ``torch.ops.trtpipe.paged_attention`` / ``.int4_gemm``
(``ops/<op>/torch_op.py``), and :func:`onnx_translation_table` maps each to its translation into
one ``trtpipe`` node (``ops/<op>/onnx_script.py``; domain ``trtpipe``, version 1).

Importing this module imports torch and onnxscript: only the build side (``trtpipe.pipeline``)
does so.
"""

from __future__ import annotations

import torch

from trtpipe.plugins.ops.int4_gemm.torch_op import int4_gemm
from trtpipe.plugins.ops.paged_attention.torch_op import paged_attention

__all__ = ["paged_attention", "int4_gemm", "onnx_translation_table"]


def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export``: each op -> one ``trtpipe`` node."""
    from trtpipe.plugins.ops.int4_gemm.onnx_script import int4_gemm_onnx
    from trtpipe.plugins.ops.paged_attention.onnx_script import paged_attention_onnx

    return {
        torch.ops.trtpipe.paged_attention.default: paged_attention_onnx,
        torch.ops.trtpipe.int4_gemm.default: int4_gemm_onnx,
    }
