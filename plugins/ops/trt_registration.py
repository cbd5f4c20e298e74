"""What the ops' ``tensorrt.plugin`` registrations share: functions with signatures built from a
:class:`~trtpipe.plugins.ops.spec.PluginSpec`, the AOT launch record, the dtype names.

``tensorrt.plugin`` reads a plugin's parameter lists from its functions' signatures (tensors
annotated ``TensorDesc`` first, then the fields annotated with their Python types; ``autotune``
with the fields it reads and ``outputs``; ``aot_impl`` with every field, ``outputs`` and
``tactic``). :func:`register_plugin` gives each function the signature the plugin's description
implies (:meth:`~trtpipe.plugins.ops.spec.PluginSpec.signature`), so no op restates its inputs and
attributes; the bodies receive the bound arguments as one namespace.

Takes the ``tensorrt.plugin`` module as an argument (tests pass one built on ``tensorrt-lean``'s
bindings; TensorRT's own on a GPU box). A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations  # the registered signatures are built (their annotations are objects)

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.abi import PLUGIN_NAMESPACE
from trtpipe.plugins.ops.spec import PluginSpec

__all__ = ["FLOATS", "TARGET_CC", "register_plugin", "launch", "dtype_name", "fields"]

FLOATS = "FP16|FP32|BF16"  # autotune type alternatives, index-wise: all float I/O share one dtype
TARGET_CC: dict[str, int] = {"cc": 80}  # the SM the AOT kernels are compiled for (register_plugins sets it)

Body = Callable[[SimpleNamespace], Any]


def _with_signature(body: Body, sig: inspect.Signature, name: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        return body(SimpleNamespace(**sig.bind(*args, **kwargs).arguments))

    fn.__signature__ = sig  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = body.__doc__
    return fn


def _tuple_of(*types: Any) -> Any:
    """``tuple[types...]`` built at run time (tensorrt.plugin reads it as an annotation object)."""
    return tuple.__class_getitem__(types)


def register_plugin(trtp: Any, plugin: PluginSpec, *, desc: Body, autotune: Body, aot_impl: Body) -> Any:
    """Register ``plugin`` (``trtpipe::<name>``) with ``tensorrt.plugin``: ``desc`` (output
    descriptors), ``autotune`` (dtype combinations, tactics) and ``aot_impl`` (kernel name, PTX,
    launch parameters, extra scalars), each called with the bound arguments. Returns the
    registered ``register`` function."""
    desc_t = trtp.TensorDesc  # annotations are built at run time from the module passed in
    plugin_id = f"{PLUGIN_NAMESPACE}::{plugin.name}"
    snake = plugin.name[0].lower() + "".join(f"_{c.lower()}" if c.isupper() else c for c in plugin.name[1:])
    outputs = ("outputs", _tuple_of(desc_t))
    returns = _tuple_of(*(desc_t,) * len(plugin.outputs))
    registered = trtp.register(plugin_id)(
        _with_signature(desc, plugin.signature(desc_t, returns=returns), f"{snake}_desc")
    )
    combinations = list.__class_getitem__(trtp.AutoTuneCombination)
    tune = plugin.signature(desc_t, attributes=plugin.autotune_attributes, extra=[outputs], returns=combinations)
    trtp.autotune(plugin_id)(_with_signature(autotune, tune, f"{snake}_autotune"))
    aot_returns = _tuple_of(str, str, trtp.KernelLaunchParams, trtp.SymExprs)
    aot = plugin.signature(desc_t, extra=[outputs, ("tactic", int)], returns=aot_returns)
    trtp.aot_impl(plugin_id)(_with_signature(aot_impl, aot, f"{snake}_aot"))
    return registered


def launch(trtp: Any, name: str, ptx: str, grid: tuple, k: Any, extras: tuple) -> tuple:
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


def dtype_name(trt: Any, dt: Any) -> str:
    """``"fp16"`` / ``"fp32"`` / ``"bf16"`` of a TensorRT dtype; OpError for another."""
    if dt == trt.float16:
        return "fp16"
    if dt == trt.float32:
        return "fp32"
    if dt == getattr(trt, "bfloat16", object()):
        return "bf16"
    raise OpError(f"plugin input dtype {dt}: expected fp16, bf16 or fp32")


def fields(a: SimpleNamespace, plugin: PluginSpec) -> dict[str, Any]:
    """``{field: value}`` of the plugin's fields in the bound arguments ``a`` (what
    :func:`trtpipe.plugins.ops.trt_kernels.compile_plugin_kernel` takes as ``attrs``)."""
    return {n: getattr(a, n) for n in plugin.attribute_names}
