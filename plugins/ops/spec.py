"""The description record of a custom op, and the parameter lists every backend builds from it.

Each op is described once, in ``ops/<op>/spec.py``, as an :class:`OpSpec`: inputs and outputs
(:class:`Tensor`), type constraints (:class:`TypeConstraint`) and attributes (:class:`Attribute`),
named as ONNX names them, plus the TensorRT plugins it lowers to (:class:`PluginSpec`). The
backends BUILD their parameter lists from that record instead of restating them::

    OpSpec ──► ONNX schema + ABI hash ............ ops/abi.py, ops/onnx_schema.py
           ├─► python_signature("call") ......... NumPy reference, Triton launchers (inputs, then
           │                                        keyword-only attributes; :meth:`OpSpec.implement`)
           ├─► python_signature("positional") ... torch custom op (:meth:`OpSpec.torch_schema`) and
           │                                        the exporter's translation (ops/export.py)
           ├─► PluginSpec.signature(...) ........ tensorrt.plugin register / autotune / aot_impl
           │                                        (ops/trt_registration.py)
           └─► wrapper_signature(...) ........... the plugins' wrapper kernels' Triton signature
                                                    (ops/trt_kernel_abi.py)

Python names are the ONNX names unless a tensor gives its own (``Tensor("A", ..., arg="a")``:
Int4Gemm's ``A`` / ``B`` have always been ``a`` / ``b_packed`` in Python). Attributes with
``argument=False`` (``plugin_namespace`` / ``plugin_version``, read by TensorRT's ONNX parser to
find the plugin creator) are part of the schema and its ABI hash and of no Python signature.

"positional" follows Python's rule for positional parameters: only the trailing run of
parameters with a default keeps it (Int4Gemm's ``bits=4``; PagedAttention's ``sliding_window=0``,
not ``scale``, which a required ``block_size`` follows).

Pure Python (``inspect``, ``types``): no onnx, torch, triton or tensorrt import.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

from trtpipe.plugins import PLUGIN_VERSION

__all__ = [
    "Tensor",
    "TypeConstraint",
    "Attribute",
    "OpSpec",
    "PluginSpec",
    "FLOAT_TENSORS",
    "TRT_PARSER_FIELDS",
    "keyword",
]

R = TypeVar("R")
FLOAT_TENSORS = ("tensor(float)", "tensor(float16)")  # the float tensor types both ops accept
_PY_TYPES: dict[str, type] = {"int": int, "float": float, "string": str}
_TORCH_TYPES = {"int": "int", "float": "float", "string": "str"}
_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Tensor:
    """One input or output of an op."""

    name: str  # ONNX name (schema, ABI hash)
    type: str  # its type constraint, e.g. "T"
    doc: str  # shape and meaning
    optional: bool = False  # an optional input: absent in ONNX, None in Python
    arg: str = ""  # Python / torch argument name when it differs from ``name``
    rank: int | None = None  # rank the NumPy reference checks (index tensors); None: checked by shape

    @property
    def arg_name(self) -> str:
        return self.arg or self.name


@dataclass(frozen=True)
class TypeConstraint:
    name: str  # e.g. "T"
    types: tuple[str, ...]  # ONNX type strings, e.g. ("tensor(float)", "tensor(float16)")
    doc: str


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "int" | "float" | "string"
    default: int | float | str | None  # None: required
    doc: str
    argument: bool = True  # False: a TensorRT parser field, in the schema but in no Python signature

    @property
    def py_type(self) -> type:
        return _PY_TYPES[self.kind]


# the attributes TensorRT's ONNX parser reads to find a plugin creator (both ops accept them; no semantic effect)
TRT_PARSER_FIELDS = (
    Attribute("plugin_namespace", "string", "", "TensorRT plugin namespace (no semantic effect)", argument=False),
    Attribute(
        "plugin_version", "string", PLUGIN_VERSION, "TensorRT plugin version (no semantic effect)", argument=False
    ),
)


@dataclass(frozen=True)
class PluginSpec:
    """A TensorRT plugin an op lowers to: its creator name and, in TensorRT's order, the input
    tensors, outputs and fields (the op's attributes it carries, plus plugin-only ones)."""

    name: str  # plugin creator name, e.g. "PagedKVWrite"
    inputs: tuple[str, ...]  # Python names of its input tensors
    outputs: tuple[str, ...]  # names of its outputs (their count is the register return arity)
    attributes: tuple[Attribute, ...]  # its fields, in order
    autotune_attributes: tuple[str, ...] = ()  # the fields its autotune function reads

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def signature(
        self,
        tensor: Any,
        *,
        attributes: Sequence[str] | None = None,
        extra: Sequence[tuple[str, Any]] = (),
        returns: Any,
    ) -> inspect.Signature:
        """``(inputs: tensor..., fields..., extra...) -> returns``: every parameter positional or
        keyword, no defaults (tensorrt.plugin refuses them). ``attributes`` picks fields by name
        (default: all, in order); ``extra`` appends ``(name, annotation)`` pairs (``outputs``,
        ``tactic``)."""
        names = self.attribute_names if attributes is None else tuple(attributes)
        by_name = {a.name: a for a in self.attributes}
        params = [_param(n, tensor) for n in self.inputs]
        params += [_param(n, by_name[n].py_type) for n in names]
        params += [_param(n, annotation) for n, annotation in extra]
        return inspect.Signature(params, return_annotation=returns)


def keyword(name: str, default: Any) -> inspect.Parameter:
    """A keyword-only parameter ``name=default`` for :meth:`OpSpec.implement`'s ``extra``."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)


def _param(name: str, annotation: Any = _EMPTY, default: Any = _EMPTY, kind: Any = None) -> inspect.Parameter:
    return inspect.Parameter(
        name, kind or inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation
    )


@dataclass(frozen=True)
class OpSpec:
    """The one description of a ``trtpipe`` op (ONNX domain ``trtpipe``, version 1)."""

    name: str  # ONNX op type, e.g. "PagedAttention"
    torch_name: str  # torch.ops.trtpipe.<torch_name>
    doc: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    type_constraints: tuple[TypeConstraint, ...]
    attributes: tuple[Attribute, ...]
    plugins: tuple[PluginSpec, ...] = field(default=())

    @property
    def arguments(self) -> tuple[Attribute, ...]:
        """The attributes the Python backends take (``argument=True``), in order."""
        return tuple(a for a in self.attributes if a.argument)

    def attribute(self, name: str) -> Attribute:
        return next(a for a in self.attributes if a.name == name)

    def plugin(self, name: str) -> PluginSpec:
        return next(p for p in self.plugins if p.name == name)

    def canonical(self) -> dict[str, list]:
        """The ABI-relevant part (ops/abi.py's canonical text): names, types, optionality, kinds
        and defaults; docs left out, so rewording one does not change the ABI."""
        return {
            "inputs": [[t.name, t.type, t.optional] for t in self.inputs],
            "outputs": [[t.name, t.type, t.optional] for t in self.outputs],
            "type_constraints": [[c.name, sorted(c.types)] for c in self.type_constraints],
            "attributes": [[a.name, a.kind, a.default] for a in self.attributes],
        }

    @functools.cache  # noqa: B019  (a handful of frozen, module-level specs)
    def python_signature(self, style: str = "call", inputs: tuple[str, ...] | None = None) -> inspect.Signature:
        """The op's Python parameter list (see the module docstring).

        ``"call"``: inputs positional or keyword (an optional input defaults to None), then the
        attributes keyword-only with their defaults. ``"positional"``: all positional or keyword,
        defaults only on the trailing run. Annotations are left empty (backends add their own).
        ``inputs``: only these inputs, by Python name, in the op's order (a kernel launcher that
        reads part of them); default all.
        """
        if style not in ("call", "positional"):
            raise ValueError(f"style={style!r}: expected 'call' or 'positional'")
        picked = [t for t in self.inputs if inputs is None or t.arg_name in inputs]
        if inputs is not None and len(picked) != len(inputs):
            raise ValueError(f"inputs={inputs}: expected names of {[t.arg_name for t in self.inputs]}")
        items: list[tuple[str, Any]] = [(t.arg_name, None if t.optional else _EMPTY) for t in picked]
        kw = inspect.Parameter.KEYWORD_ONLY if style == "call" else None
        attrs = [(a.name, _EMPTY if a.default is None else a.default) for a in self.arguments]
        if style == "call":
            return inspect.Signature(
                [_param(n, default=d) for n, d in items] + [_param(n, default=d, kind=kw) for n, d in attrs]
            )
        items += attrs
        keep = len(items)
        while keep and items[keep - 1][1] is not _EMPTY:
            keep -= 1
        return inspect.Signature([_param(n, default=d if i >= keep else _EMPTY) for i, (n, d) in enumerate(items)])

    def torch_schema(self) -> str:
        """``torch.library`` schema of the op: ``(Tensor query, ..., int num_heads, ...) -> (Tensor, ...)``
        from the "positional" signature (an optional input is ``Tensor?``). Optional outputs are
        left out: the torch op is the exporter's, which writes float pools (PagedAttention's int8
        scale outputs appear when a lowering retypes the pool)."""
        kinds = {t.arg_name: "Tensor?" if t.optional else "Tensor" for t in self.inputs}
        kinds.update({a.name: _TORCH_TYPES[a.kind] for a in self.arguments})
        parts = []
        for p in self.python_signature("positional").parameters.values():
            default = "" if p.default is _EMPTY else f"={'None' if p.default is None else p.default!r}"
            parts.append(f"{kinds[p.name]} {p.name}{default}")
        required = [t for t in self.outputs if not t.optional]
        outs = ", ".join("Tensor" for _ in required)
        return f"({', '.join(parts)}) -> {outs if len(required) == 1 else f'({outs})'}"

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any], *, style: str = "call") -> SimpleNamespace:
        """Arguments of a call as ``namespace(<input>=..., <attribute>=...)``, defaults applied.
        Raises TypeError as a Python function with :meth:`python_signature` would."""
        bound = self.python_signature(style).bind(*args, **kwargs)
        bound.apply_defaults()
        return SimpleNamespace(**bound.arguments)

    def implement(
        self, style: str = "call", extra: Sequence[inspect.Parameter] = (), inputs: tuple[str, ...] | None = None
    ) -> Callable[[Callable[[SimpleNamespace], R]], Callable[..., R]]:
        """Decorator: ``body(a)`` (``a`` the bound arguments) becomes a function with the op's
        :meth:`python_signature` (``extra``: keyword-only parameters appended, e.g. a launcher's
        tile sizes, see :func:`keyword`; ``inputs``: a subset of the inputs). The function keeps
        the body's name and docstring."""
        base = self.python_signature(style, inputs)
        sig = base.replace(parameters=[*base.parameters.values(), *extra])

        def wrap(body: Callable[[SimpleNamespace], R]) -> Callable[..., R]:
            def op(*args: Any, **kwargs: Any) -> R:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                return body(SimpleNamespace(**bound.arguments))

            op.__name__, op.__qualname__, op.__doc__ = body.__name__, body.__qualname__, body.__doc__
            op.__module__ = body.__module__
            op.__signature__ = sig  # type: ignore[attr-defined]
            return op

        return wrap
