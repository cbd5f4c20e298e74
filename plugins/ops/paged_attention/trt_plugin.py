"""TensorRT plugins of ``trtpipe::PagedAttention`` (namespace ``trtpipe``, version ``1``): the
``tensorrt.plugin`` registration of its two plugins, whose parameter lists come from
:data:`~trtpipe.plugins.ops.paged_attention.spec.PAGED_ATTENTION` (:func:`~trtpipe.plugins.ops.trt_registration.register_plugin`)
and whose nodes :mod:`trtpipe.plugins.ops.paged_attention.lower_trt` writes:

==============  ========================================================  ==========================
plugin          inputs -> outputs                                         kernel (trt_kernels.py)
==============  ========================================================  ==========================
PagedKVWrite    key, value, key_cache, value_cache, slot_mapping          kv_write_plugin_kernel
                -> key_cache_out, value_cache_out (aliased: in place)     (extra: NB)
PagedAttention  query, key_cache, value_cache, block_tables,              decode=1: attention_decode_
                context_lens, query_start_loc -> output                   plugin_kernel; 0: ..._prefill
                                                                          (extras: [S,] MB, NB)
==============  ========================================================  ==========================

KV caches are head-major ``[KVH, NB, BS, D]`` per layer (docs/contracts.md); NB comes from
``key_cache``'s axis 1 and reaches the kernels as an extra scalar (``num_blocks``), so one plan
serves any pool size its optimization profile allows. Prefill attention lists its tile
configurations (:data:`~trtpipe.plugins.ops.paged_attention.trt_kernels.PREFILL_TACTICS`) as
tactics TensorRT times per optimization profile. Imports triton (through the kernels; import it
lazily, build side only). A plugin ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION
from trtpipe.plugins.ops.paged_attention.trt_kernels import PREFILL_TACTICS
from trtpipe.plugins.ops.trt_kernels import compile_plugin_kernel, kernel_config
from trtpipe.plugins.ops.trt_registration import FLOATS, TARGET_CC, dtype_name, fields, launch, register_plugin

__all__ = ["register_kv_write", "register_attention"]

KV_WRITE = PAGED_ATTENTION.plugin("PagedKVWrite")
ATTENTION = PAGED_ATTENTION.plugin("PagedAttention")


def register_kv_write(trtp: Any, trt: Any) -> Any:
    """PagedKVWrite: outputs alias the caches ``[KVH, NB, BS, D]`` (in-place write); grid (T,),
    extra scalar NB."""

    def desc(a: SimpleNamespace) -> tuple:
        return a.key_cache.aliased(), a.value_cache.aliased()

    def autotune(a: SimpleNamespace) -> list:
        return [trtp.AutoTuneCombination(f"{FLOATS}, {FLOATS}, {FLOATS}, {FLOATS}, INT64, {FLOATS}, {FLOATS}")]

    def aot_impl(a: SimpleNamespace) -> tuple:
        dt = dtype_name(trt, a.key.dtype)
        name, ptx, k = compile_plugin_kernel("PagedKVWrite", fields(a, KV_WRITE), dt, cc=TARGET_CC["cc"])
        return launch(trtp, name, ptx, (a.key.shape_expr[0],), k, (a.key_cache.shape_expr[1],))

    return register_plugin(trtp, KV_WRITE, desc=desc, autotune=autotune, aot_impl=aot_impl)


def register_attention(trtp: Any, trt: Any) -> Any:
    """PagedAttention: output like the query; caches ``[KVH, NB, BS, D]``; decode grid (S, KVH),
    extras (MB, NB); prefill (T // BLOCK_Q + S, KVH), extras (S, MB, NB)."""

    def desc(a: SimpleNamespace) -> tuple:
        return a.query.like()

    def autotune(a: SimpleNamespace) -> list:
        tactics = [1] if a.decode else sorted(PREFILL_TACTICS)
        return [
            trtp.AutoTuneCombination(f"{FLOATS}, {FLOATS}, {FLOATS}, INT64, INT64, INT64, {FLOATS}", "LINEAR", tactics)
        ]

    def aot_impl(a: SimpleNamespace) -> tuple:
        attrs, dt = fields(a, ATTENTION), dtype_name(trt, a.query.dtype)
        name, ptx, k = compile_plugin_kernel("PagedAttention", attrs, dt, cc=TARGET_CC["cc"], tactic=a.tactic)
        S, MB = a.block_tables.shape_expr[0], a.block_tables.shape_expr[1]
        NB = a.key_cache.shape_expr[1]
        if a.decode:
            return launch(trtp, name, ptx, (S, a.num_kv_heads), k, (MB, NB))
        bq = kernel_config("PagedAttention", attrs, dt, a.tactic)[2]["BLOCK_Q"]
        return launch(trtp, name, ptx, (a.query.shape_expr[0] // bq + S, a.num_kv_heads), k, (S, MB, NB))

    return register_plugin(trtp, ATTENTION, desc=desc, autotune=autotune, aot_impl=aot_impl)
