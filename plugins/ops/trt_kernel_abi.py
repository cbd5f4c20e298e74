"""The kernel ABI of a TensorRT AOT plugin, and the Triton signature of a plugin's wrapper kernel
built from the plugin's description.

TensorRT launches an AOT kernel with ``(inputs..., extra scalar args..., outputs...)``. Each
plugin's wrapper ``@triton.jit`` kernel (``ops/<op>/trt_kernels.py``) takes exactly that: one
``<name>_ptr`` per input of its :class:`~trtpipe.plugins.ops.spec.PluginSpec` (in order), its
extra scalars, one ``<name>_ptr`` per output, then constexprs. Triton reads a kernel's parameter
list from its source, so the wrappers spell it out; :func:`wrapper_signature` builds the
signature the AOT compiler needs from the description (pointer types from the op's type
constraints), and a test holds each wrapper's parameter list equal to it. A plugin ABI source
(:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

from collections.abc import Iterable

from trtpipe.plugins.ops.spec import OpSpec, PluginSpec

__all__ = ["wrapper_parameters", "wrapper_signature"]

_POINTERS = {"tensor(int64)": "*i64", "tensor(uint8)": "*u8"}  # non-float tensors; float ones take the dtype


def wrapper_parameters(plugin: PluginSpec, extras: Iterable[str]) -> list[str]:
    """The runtime parameters of the plugin's wrapper kernel, in TensorRT's launch order."""
    return [f"{n}_ptr" for n in plugin.inputs] + list(extras) + [f"{n}_ptr" for n in plugin.outputs]


def wrapper_signature(
    op: OpSpec, plugin: PluginSpec, f: str, extras: Iterable[str], constexprs: Iterable[str]
) -> dict[str, str]:
    """Triton signature ``{parameter: type}`` of the wrapper kernel: ``f`` (e.g. ``"*fp16"``) for
    a float tensor (a type constraint that admits floats), ``*i64`` / ``*u8`` for index / code
    tensors, ``i32`` for the extra scalars, ``constexpr`` for ``constexprs``."""
    tensors = {t.arg_name: t for t in op.inputs} | {t.name: t for t in op.outputs}
    constraints = {c.name: c.types for c in op.type_constraints}

    def pointer(name: str) -> str:
        types = constraints[tensors[name].type]
        return f if any("float" in t for t in types) else _POINTERS[types[0]]

    extras = list(extras)
    sig = {p: pointer(p[: -len("_ptr")]) if p not in extras else "i32" for p in wrapper_parameters(plugin, extras)}
    return sig | {k: "constexpr" for k in constexprs}
