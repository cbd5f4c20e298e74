"""torch custom op ``trtpipe::int4_gemm`` (for ``torch.onnx.export(dynamo=True)``), with the
schema built from the op's description (:data:`~trtpipe.plugins.ops.int4_gemm.spec.INT4_GEMM`).

Meaning: docs/contracts.md and :mod:`trtpipe.plugins.ops.int4_gemm.reference` (the NumPy
definition); the eager body is a torch implementation of it (com.microsoft::MatMulNBits layout).

Importing this module imports torch: only the build side (``trtpipe.pipeline``) does so.
"""

from __future__ import annotations

from typing import Any

import torch

from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM

__all__ = ["int4_gemm", "unpack_int4_torch"]


def _nibbles_torch(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[...]`` -> float32 ``[..., 2]`` (low nibble, high nibble): the MatMulNBits byte
    (:mod:`trtpipe.plugins.ops.int4_gemm.layout`, whose NumPy tests define the order) in torch."""
    return torch.stack([(packed & 0x0F).float(), (packed >> 4).float()], dim=-1)


def unpack_int4_torch(b_packed: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """[N, K/G, G/2] uint8 (low nibble = even code) -> codes [N, K] float32."""
    return _nibbles_torch(b_packed).reshape(N, K)


def _zero_points_full(zero_points: torch.Tensor, N: int, n_groups: int) -> torch.Tensor:
    if zero_points.dtype == torch.uint8:
        return _nibbles_torch(zero_points).reshape(N, -1)[:, :n_groups]
    return zero_points.float()


def _int4_gemm(*args: Any, **kwargs: Any) -> torch.Tensor:
    """Weight-only INT4 GEMM: a [..., K] @ W^T with W[N, K] = (q - zp) * scale blockwise along K
    (docs/contracts.md; com.microsoft::MatMulNBits layout). ``bits=8``: codes [N, K/G, G] bytes,
    default zero point 128 (an 8-bit LM head). Returns [..., N] in a's dtype."""
    x = INT4_GEMM.bind(args, kwargs, style="positional")
    K, N, G, zero_points = x.K, x.N, x.group_size, x.zero_points
    n_groups = K // G
    if x.bits == 8:
        q = x.b_packed.float().view(N, n_groups, G)
        zp = zero_points.float().view(N, n_groups) if zero_points is not None else torch.full((N, n_groups), 128.0)
    else:
        q = unpack_int4_torch(x.b_packed, K, N).view(N, n_groups, G)
        zp = _zero_points_full(zero_points, N, n_groups) if zero_points is not None else torch.full((N, n_groups), 8.0)
    w = ((q - zp[..., None]) * x.scales.float()[..., None]).view(N, K)
    return (x.a.float() @ w.t()).to(x.a.dtype)


int4_gemm = torch.library.custom_op(
    f"trtpipe::{INT4_GEMM.torch_name}", _int4_gemm, mutates_args=(), schema=INT4_GEMM.torch_schema()
)


@int4_gemm.register_fake
def _int4_gemm_fake(*args: Any, **kwargs: Any) -> torch.Tensor:
    x = INT4_GEMM.bind(args, kwargs, style="positional")
    return x.a.new_empty((*x.a.shape[:-1], x.N))
