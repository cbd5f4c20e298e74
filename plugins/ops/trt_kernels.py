"""Plugin-side kernels of the TensorRT plugins (:mod:`trtpipe.plugins.ops.trt_plugins`): the
configuration of each plugin's wrapper ``@triton.jit`` kernel per node attributes, dtype and
tactic (:func:`kernel_config`, over the ops' ``trt_kernels.py``), and its ahead-of-time
compilation to PTX (no GPU needed).

Kernel ABI. TensorRT launches an AOT kernel with ``(inputs..., extra scalar args..., outputs...)``.
The ops' kernels (``ops/<op>/triton_kernels.py``) take outputs first and runtime strides, so
each plugin has a small wrapper ``@triton.jit`` kernel in that order that calls the shared
kernel body with strides fixed at compile time (contiguous tensors). The KV pools are head-major
``[KVH, NB, BS, D]``: NB varies with the pool a runtime sizes, so the KV plugins take it as an
extra scalar (``num_blocks``, from ``key_cache``'s axis 1) and widen ``num_blocks * BS * D`` to
int64 in the kernel (the head stride). Triton >= 3.3 appends two
hidden pointer parameters (global and profile scratch); they are unused when the kernel needs
no scratch (checked), and :func:`strip_unused_params` removes them from the PTX entry so the
parameter list is exactly what TensorRT passes.

This module imports triton at module level (import it lazily, build side only). It is a plugin
ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from typing import Any

import triton

from trtpipe.plugins.core.dtypes import FLOAT_NAMES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.abi import PLUGIN_ATTRIBUTES
from trtpipe.plugins.ops.int4_gemm.trt_kernels import INT4_TACTICS, int4_gemm_config
from trtpipe.plugins.ops.paged_attention.trt_kernels import PREFILL_TACTICS, attention_config, kv_write_config

__all__ = ["INT4_TACTICS", "PREFILL_TACTICS", "kernel_config", "strip_unused_params", "compile_plugin_kernel"]


def kernel_config(plugin: str, attrs: dict[str, Any], dtype: str, tactic: int = 1) -> tuple[Any, dict, dict, int]:
    """``(wrapper kernel, signature, constexprs, num_warps)`` of ``plugin`` for node attributes
    ``attrs``, float dtype ("fp16" | "fp32") and tactic. Raises :class:`OpError` on bad values."""
    f = f"*{dtype}" if dtype in FLOAT_NAMES else None  # Triton pointer types spell dtypes as recipes do
    if f is None:
        raise OpError(f"dtype {dtype!r}: the plugins run fp16, bf16 or fp32")
    if plugin == "PagedKVWrite":
        return kv_write_config(attrs, f)
    if plugin == "PagedAttention":
        return attention_config(attrs, dtype, f, tactic)
    if plugin == "Int4Gemm":
        return int4_gemm_config(attrs, dtype, f, tactic)
    raise OpError(f"unknown plugin {plugin!r}; expected one of {sorted(PLUGIN_ATTRIBUTES)}")


def strip_unused_params(ptx: str, kernel_name: str, keep: int) -> str:
    """Remove the PTX entry parameters of ``kernel_name`` from index ``keep`` on (Triton's hidden
    scratch pointers), after checking the body never reads them. Raises :class:`OpError` if one
    is used (the kernel then needs scratch memory TensorRT does not provide)."""
    head_start = ptx.index(f".entry {kernel_name}(")
    head_end = ptx.index(")", head_start)
    params = [p.strip() for p in ptx[head_start + len(f".entry {kernel_name}(") : head_end].split(",") if p.strip()]
    if len(params) <= keep:
        return ptx
    body = ptx[head_end:]
    for i in range(keep, len(params)):
        if f"[{kernel_name}_param_{i}]" in body:
            raise OpError(
                f"kernel {kernel_name} reads hidden parameter {i} (Triton scratch memory); the TensorRT "
                "AOT launch does not pass it"
            )
    new_head = ",\n\t".join(params[:keep])
    return ptx[:head_start] + f".entry {kernel_name}(\n\t{new_head}\n" + ptx[head_end:]


def compile_plugin_kernel(
    plugin: str, attrs: dict[str, Any], dtype: str, *, cc: int, tactic: int = 1
) -> tuple[str, str, Any]:
    """Compile the plugin's wrapper kernel for ``sm_<cc>`` (no GPU needed) and return
    ``(kernel name, PTX with exactly the TensorRT-launched parameters, triton CompiledKernel)``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, sig, consts, warps = kernel_config(plugin, attrs, dtype, tactic)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", int(cc), 32), options={"num_warps": warps})
    m = k.metadata
    if getattr(m, "global_scratch_size", 0) or getattr(m, "profile_scratch_size", 0):
        raise OpError(f"{plugin}: the Triton kernel needs scratch memory, which TensorRT AOT plugins do not provide")
    n_args = sum(1 for v in sig.values() if v != "constexpr")
    return m.name, strip_unused_params(k.asm["ptx"], m.name, n_args), k
