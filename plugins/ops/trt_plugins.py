"""TensorRT plugins of the ``trtpipe`` ops: ``tensorrt.plugin`` registration with AOT Triton kernels.

Plugins (namespace ``trtpipe``, version ``1``; their graph nodes come from
:func:`trtpipe.plugins.lowering.trt.lower_with_plugins`):

==============  ========================================================  ==========================
plugin          inputs -> outputs                                         kernel (triton_kernels.py)
==============  ========================================================  ==========================
PagedKVWrite    key, value, key_cache, value_cache, slot_mapping          write_kv_cache_kernel
                -> key_cache_out, value_cache_out (aliased: in place)     (extra: NB)
PagedAttention  query, key_cache, value_cache, block_tables,              decode=1: paged_attention_
                context_lens, query_start_loc -> output                   decode_kernel; 0: ..._prefill
                                                                          (extras: [S,] MB, NB)
Int4Gemm        A, B, scales, zero_points (float) -> Y                    int4_gemm_kernel (ZP_MODE 2)
==============  ========================================================  ==========================

KV caches are head-major ``[KVH, NB, BS, D]`` per layer (docs/contracts.md); NB comes from
``key_cache``'s axis 1 and reaches the kernels as an extra scalar (``num_blocks``), so one plan
serves any pool size its optimization profile allows.

``register`` describes outputs symbolically; ``aot_impl`` compiles the Triton kernel to PTX at
engine build time, so the plan embeds it and runs without Python (TensorRT >= 10.7);
``autotune`` lists the dtype combinations and, for Int4Gemm and prefill attention, tile
configurations as tactics that TensorRT times per optimization profile (GEMV-shaped tiles win
for decode, wider tiles for prefill).

The wrapper kernels in TensorRT's argument order, their configurations and their AOT
compilation to PTX live in :mod:`trtpipe.plugins.ops.trt_kernels` (re-exported here).

This module imports triton (through ``trt_plugin_kernels``; import it lazily, build side only). Registration
takes the ``tensorrt.plugin`` module as an argument (tests pass one built on
``tensorrt-lean``'s bindings; TensorRT's own on a GPU box).
"""

# no `from __future__ import annotations`: tensorrt.plugin reads the annotations as objects
from typing import TYPE_CHECKING, Any

from trtpipe.plugins import PLUGIN_VERSION
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.versions import TRT_PLUGINS_MIN_VERSION, trt_has_python_plugins
from trtpipe.plugins.lowering.trt import PLUGIN_ATTRIBUTES, PLUGIN_NAMESPACE
from trtpipe.plugins.ops.trt_kernels import (
    INT4_TACTICS,
    PREFILL_TACTICS,
    compile_plugin_kernel,
    kernel_config,
    strip_unused_params,
)

if TYPE_CHECKING:
    from typing import TypeAlias  # Python >= 3.10; only mypy reads it

MIN_TRT_VERSION = TRT_PLUGINS_MIN_VERSION  # tensorrt.plugin with aot_impl (home: plugins/core/versions.py)
PLUGIN_VERSIONS = {name: PLUGIN_VERSION for name in PLUGIN_ATTRIBUTES}


# ============================================================================================
# tensorrt.plugin registration
# ============================================================================================

_REGISTERED: dict[int, dict[str, Any]] = {}  # id(trtp) -> state
_TARGET_CC: dict[str, int] = {"cc": 80}


def trt_version_supports_plugins(version: str) -> bool:
    """True for TensorRT >= 10.7 (``tensorrt.plugin`` with ``aot_impl``); False for a version
    string without ``major.minor``."""
    try:
        return trt_has_python_plugins(version)
    except ValueError:
        return False


def _dtype_name(trt: Any, dt: Any) -> str:
    if dt == trt.float16:
        return "fp16"
    if dt == trt.float32:
        return "fp32"
    if dt == getattr(trt, "bfloat16", object()):
        return "bf16"
    raise OpError(f"plugin input dtype {dt}: expected fp16, bf16 or fp32")


_FLOATS = "FP16|FP32|BF16"  # autotune type alternatives, index-wise: all float I/O share one dtype


def register_plugins(trtp: Any = None, *, cc: int | None = None) -> dict[str, Any]:
    """Register PagedKVWrite, PagedAttention and Int4Gemm with ``tensorrt.plugin`` (idempotent per
    module). ``cc`` (e.g. 80) is the SM the AOT kernels are compiled for (the build target).
    Returns ``{plugin id: register function}``."""
    if trtp is None:
        import tensorrt.plugin as trt_plugin_module  # noqa: PLC0415  (TensorRT >= 10.7)

        trtp = trt_plugin_module
    if cc is not None:
        _TARGET_CC["cc"] = int(cc)
    state = _REGISTERED.get(id(trtp))
    if state is not None:
        return state
    import tensorrt as trt

    ns = PLUGIN_NAMESPACE
    ids = {
        f"{ns}::PagedKVWrite": _register_kv_write(trtp, trt),
        f"{ns}::PagedAttention": _register_attention(trtp, trt),
        f"{ns}::Int4Gemm": _register_int4_gemm(trtp, trt),
    }
    _REGISTERED[id(trtp)] = ids
    return ids


def _launch(trtp: Any, name: str, ptx: str, grid: tuple, k: Any, extras: tuple) -> tuple:
    """``aot_impl``'s return value: kernel name, PTX, launch parameters (grid, one warp group of
    ``num_warps * 32`` threads, the kernel's shared memory) and the extra scalar arguments."""
    lp = trtp.KernelLaunchParams()
    lp.grid_x = grid[0]
    if len(grid) > 1:
        lp.grid_y = grid[1]
    lp.block_x = k.metadata.num_warps * 32
    lp.shared_mem = k.metadata.shared
    ex = trtp.SymIntExprs(len(extras))
    for i, e in enumerate(extras):
        ex[i] = trtp.SymInt32(e)
    return name, ptx, lp, ex


def _register_kv_write(trtp: Any, trt: Any) -> Any:
    """PagedKVWrite: outputs alias the caches ``[KVH, NB, BS, D]`` (in-place write); grid (T,),
    extra scalar NB."""
    if TYPE_CHECKING:  # tensorrt.plugin is untyped and passed in: its descriptors are Any to mypy
        TensorDesc: TypeAlias = Any
    else:  # tensorrt.plugin reads the annotations as objects at registration
        TensorDesc = trtp.TensorDesc
    ns = PLUGIN_NAMESPACE

    @trtp.register(f"{ns}::PagedKVWrite")
    def paged_kv_write_desc(
        key: TensorDesc,
        value: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        slot_mapping: TensorDesc,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
    ) -> tuple[TensorDesc, TensorDesc]:
        return key_cache.aliased(), value_cache.aliased()

    @trtp.autotune(f"{ns}::PagedKVWrite")
    def paged_kv_write_autotune(
        key: TensorDesc,
        value: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        slot_mapping: TensorDesc,
        outputs: tuple[TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination(f"{_FLOATS}, {_FLOATS}, {_FLOATS}, {_FLOATS}, INT64, {_FLOATS}, {_FLOATS}")]

    @trtp.aot_impl(f"{ns}::PagedKVWrite")
    def paged_kv_write_aot(
        key: TensorDesc,
        value: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        slot_mapping: TensorDesc,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        outputs: tuple[TensorDesc],
        tactic: int,
    ) -> tuple[str, str, trtp.KernelLaunchParams, trtp.SymExprs]:
        attrs = dict(num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size)
        name, ptx, k = compile_plugin_kernel("PagedKVWrite", attrs, _dtype_name(trt, key.dtype), cc=_TARGET_CC["cc"])
        return _launch(trtp, name, ptx, (key.shape_expr[0],), k, (key_cache.shape_expr[1],))

    return paged_kv_write_desc


def _register_attention(trtp: Any, trt: Any) -> Any:
    """PagedAttention: output like the query; caches ``[KVH, NB, BS, D]``; decode grid (S, KVH),
    prefill (T // BLOCK_Q + S, KVH)."""
    if TYPE_CHECKING:  # tensorrt.plugin is untyped and passed in: its descriptors are Any to mypy
        TensorDesc: TypeAlias = Any
    else:  # tensorrt.plugin reads the annotations as objects at registration
        TensorDesc = trtp.TensorDesc
    ns = PLUGIN_NAMESPACE

    @trtp.register(f"{ns}::PagedAttention")
    def paged_attention_desc(
        query: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        block_tables: TensorDesc,
        context_lens: TensorDesc,
        query_start_loc: TensorDesc,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        block_size: int,
        sliding_window: int,
        decode: int,
    ) -> tuple[TensorDesc]:
        return query.like()

    @trtp.autotune(f"{ns}::PagedAttention")
    def paged_attention_autotune(
        query: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        block_tables: TensorDesc,
        context_lens: TensorDesc,
        query_start_loc: TensorDesc,
        decode: int,
        outputs: tuple[TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        tactics = [1] if decode else sorted(PREFILL_TACTICS)
        return [
            trtp.AutoTuneCombination(
                f"{_FLOATS}, {_FLOATS}, {_FLOATS}, INT64, INT64, INT64, {_FLOATS}", "LINEAR", tactics
            )
        ]

    _register_attention_aot(trtp, trt)
    return paged_attention_desc


def _register_attention_aot(trtp: Any, trt: Any) -> None:
    """PagedAttention's ``aot_impl`` (registered after its ``register``): decode grid (S, KVH),
    extras (MB, NB); prefill (T // BLOCK_Q + S, KVH), extras (S, MB, NB). NB is ``key_cache``'s
    axis 1 (head-major ``[KVH, NB, BS, D]``)."""
    if TYPE_CHECKING:  # tensorrt.plugin is untyped and passed in: its descriptors are Any to mypy
        TensorDesc: TypeAlias = Any
    else:  # tensorrt.plugin reads the annotations as objects at registration
        TensorDesc = trtp.TensorDesc
    ns = PLUGIN_NAMESPACE

    @trtp.aot_impl(f"{ns}::PagedAttention")
    def paged_attention_aot(
        query: TensorDesc,
        key_cache: TensorDesc,
        value_cache: TensorDesc,
        block_tables: TensorDesc,
        context_lens: TensorDesc,
        query_start_loc: TensorDesc,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        block_size: int,
        sliding_window: int,
        decode: int,
        outputs: tuple[TensorDesc],
        tactic: int,
    ) -> tuple[str, str, trtp.KernelLaunchParams, trtp.SymExprs]:
        attrs = dict(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            scale=scale,
            block_size=block_size,
            sliding_window=sliding_window,
            decode=decode,
        )
        dt = _dtype_name(trt, query.dtype)
        name, ptx, k = compile_plugin_kernel("PagedAttention", attrs, dt, cc=_TARGET_CC["cc"], tactic=tactic)
        S, MB = block_tables.shape_expr[0], block_tables.shape_expr[1]
        NB = key_cache.shape_expr[1]
        if decode:
            return _launch(trtp, name, ptx, (S, num_kv_heads), k, (MB, NB))
        bq = kernel_config("PagedAttention", attrs, dt, tactic)[2]["BLOCK_Q"]
        return _launch(trtp, name, ptx, (query.shape_expr[0] // bq + S, num_kv_heads), k, (S, MB, NB))


def _register_int4_gemm(trtp: Any, trt: Any) -> Any:
    """Int4Gemm: Y = A[..., K] @ W^T -> [..., N]; grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))."""
    if TYPE_CHECKING:  # tensorrt.plugin is untyped and passed in: its descriptors are Any to mypy
        TensorDesc: TypeAlias = Any
    else:  # tensorrt.plugin reads the annotations as objects at registration
        TensorDesc = trtp.TensorDesc
    ns = PLUGIN_NAMESPACE

    @trtp.register(f"{ns}::Int4Gemm")
    def int4_gemm_desc(
        a: TensorDesc,
        b: TensorDesc,
        scales: TensorDesc,
        zero_points: TensorDesc,
        K: int,
        N: int,
        group_size: int,
        bits: int,
    ) -> tuple[TensorDesc]:
        dims = [a.shape_expr[i] for i in range(len(a.shape_expr) - 1)] + [N]
        return (trtp.from_shape_expr(tuple(dims), dtype=a.dtype),)

    @trtp.autotune(f"{ns}::Int4Gemm")
    def int4_gemm_autotune(
        a: TensorDesc, b: TensorDesc, scales: TensorDesc, zero_points: TensorDesc, outputs: tuple[TensorDesc]
    ) -> list[trtp.AutoTuneCombination]:
        return [
            trtp.AutoTuneCombination(
                f"{_FLOATS}, UINT8, {_FLOATS}, {_FLOATS}, {_FLOATS}", "LINEAR", sorted(INT4_TACTICS)
            )
        ]

    @trtp.aot_impl(f"{ns}::Int4Gemm")
    def int4_gemm_aot(
        a: TensorDesc,
        b: TensorDesc,
        scales: TensorDesc,
        zero_points: TensorDesc,
        K: int,
        N: int,
        group_size: int,
        bits: int,
        outputs: tuple[TensorDesc],
        tactic: int,
    ) -> tuple[str, str, trtp.KernelLaunchParams, trtp.SymExprs]:
        attrs = dict(K=K, N=N, group_size=group_size, bits=bits)
        name, ptx, k = compile_plugin_kernel(
            "Int4Gemm", attrs, _dtype_name(trt, a.dtype), cc=_TARGET_CC["cc"], tactic=tactic
        )
        bm, bn = INT4_TACTICS.get(tactic, INT4_TACTICS[1])[:2]
        M = a.shape_expr.numel() // K
        return _launch(trtp, name, ptx, (trtp.cdiv(M, bm), -(-N // bn)), k, (M,))

    return int4_gemm_desc


__all__ = [
    "register_plugins",
    "compile_plugin_kernel",
    "kernel_config",
    "strip_unused_params",
    "INT4_TACTICS",
    "PREFILL_TACTICS",
    "trt_version_supports_plugins",
    "PLUGIN_VERSIONS",
    "MIN_TRT_VERSION",
]
