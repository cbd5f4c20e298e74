"""TensorRT plugin of ``trtpipe::Int4Gemm`` (namespace ``trtpipe``, version ``1``): the
``tensorrt.plugin`` registration, whose parameter lists come from
:data:`~trtpipe.plugins.ops.int4_gemm.spec.INT4_GEMM` (:func:`~trtpipe.plugins.ops.trt_registration.register_plugin`)
and whose nodes :mod:`trtpipe.plugins.ops.int4_gemm.lower_trt` writes: ``A, B, scales,
zero_points (float) -> Y`` with ``int4_gemm_plugin_kernel`` (ZP_MODE 2). Its tile configurations
(:data:`~trtpipe.plugins.ops.int4_gemm.trt_kernels.INT4_TACTICS`) are tactics TensorRT times per
optimization profile (GEMV-shaped tiles win for decode, wider tiles for prefill). Imports triton
(through the kernels; import it lazily, build side only). A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trtpipe.plugins.core.arith import cdiv
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.int4_gemm.trt_kernels import INT4_TACTICS
from trtpipe.plugins.ops.trt_kernels import compile_plugin_kernel
from trtpipe.plugins.ops.trt_registration import FLOATS, TARGET_CC, dtype_name, fields, launch, register_plugin

__all__ = ["register_int4_gemm"]

PLUGIN = INT4_GEMM.plugin("Int4Gemm")


def register_int4_gemm(trtp: Any, trt: Any) -> Any:
    """Int4Gemm: Y = A[..., K] @ W^T -> [..., N]; grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))."""

    def desc(a: SimpleNamespace) -> tuple:
        dims = [a.a.shape_expr[i] for i in range(len(a.a.shape_expr) - 1)] + [a.N]
        return (trtp.from_shape_expr(tuple(dims), dtype=a.a.dtype),)

    def autotune(a: SimpleNamespace) -> list:
        combination = f"{FLOATS}, UINT8, {FLOATS}, {FLOATS}, {FLOATS}"
        return [trtp.AutoTuneCombination(combination, "LINEAR", sorted(INT4_TACTICS))]

    def aot_impl(a: SimpleNamespace) -> tuple:
        dt = dtype_name(trt, a.a.dtype)
        name, ptx, k = compile_plugin_kernel("Int4Gemm", fields(a, PLUGIN), dt, cc=TARGET_CC["cc"], tactic=a.tactic)
        bm, bn = INT4_TACTICS.get(a.tactic, INT4_TACTICS[1])[:2]
        M = a.a.shape_expr.numel() // a.K
        return launch(trtp, name, ptx, (trtp.cdiv(M, bm), cdiv(a.N, bn)), k, (M,))

    return register_plugin(trtp, PLUGIN, desc=desc, autotune=autotune, aot_impl=aot_impl)
