"""The reference model's linears: float (``F.linear``) or packed INT4 / 8-bit through
``trtpipe::int4_gemm``, built from prepared :mod:`~trtpipe.pipeline.model.quantize` weights."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import trtpipe.plugins.ops.torch_ops  # noqa: F401  (registers torch.ops.trtpipe.*)
from trtpipe.pipeline.model.quantize import FloatWeights, LinearWeights, PackedWeights


def frozen_param(a: np.ndarray) -> nn.Parameter:
    """A frozen float32 parameter; copies read-only arrays (GGUF tensors are memory-mapped)."""
    a = np.asarray(a, np.float32)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, np.float32, order="C")
    return nn.Parameter(torch.from_numpy(a), requires_grad=False)


class FloatLinear(nn.Module):
    """y = x @ W^T + b with W [out, in] float32."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None):
        super().__init__()
        self.weight = frozen_param(weight)
        self.bias = None if bias is None else frozen_param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Int4Linear(nn.Module):
    """Weight-only INT4 (or 8-bit) linear through ``trtpipe::int4_gemm`` (packed codes, scales,
    zero points of a :class:`~trtpipe.pipeline.model.quantize.PackedWeights`)."""

    def __init__(self, w: PackedWeights):
        super().__init__()
        self.register_buffer("b_packed", torch.from_numpy(np.ascontiguousarray(w.packed)))
        self.register_buffer("scales", torch.from_numpy(np.ascontiguousarray(w.scales, np.float32)))
        self.register_buffer("zero_points", torch.from_numpy(np.ascontiguousarray(w.zero_points, np.float32)))
        self.bias = None if w.bias is None else frozen_param(w.bias)
        self.K, self.N, self.group_size, self.bits = w.K, w.N, w.group_size, w.bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.trtpipe.int4_gemm(
            x, self.b_packed, self.scales, self.zero_points, self.K, self.N, self.group_size, self.bits
        )
        return y if self.bias is None else y + self.bias


def make_linear(w: LinearWeights) -> nn.Module:
    """The torch linear of prepared weights: float (``F.linear``) or packed (``trtpipe::int4_gemm``)."""
    return FloatLinear(w.weight, w.bias) if isinstance(w, FloatWeights) else Int4Linear(w)
