"""ONNX ``OpSchema`` objects built from an op's description, and the helpers the ops' Python
shape-inference functions share (onnx imported lazily: the runtime never needs it).

:func:`build_schema` turns an :class:`~trtpipe.plugins.ops.spec.OpSpec` into an
``onnx.defs.OpSchema``: with its defaults for registration (:func:`trtpipe.plugins.ops.abi.register_schemas`),
or without (``defaults=False``: every optional attribute simply optional) for the exporter's
translation (:mod:`trtpipe.plugins.ops.export`), so that tracing one node writes exactly the
attributes it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trtpipe.plugins import OP_DOMAIN, OP_VERSION
from trtpipe.plugins.ops.spec import OpSpec

__all__ = ["build_schema", "attr_int", "dims", "check_dims", "copy_type"]


def build_schema(spec: OpSpec, infer: Callable[[Any], None] | None = None, *, defaults: bool = True) -> Any:
    """``onnx.defs.OpSchema`` of ``spec`` (domain ``trtpipe``, version 1) with ``infer`` as its
    type-and-shape inference function. ``defaults=False``: optional attributes carry no default."""
    import onnx
    from onnx.defs import OpSchema

    def param(n: str, t: str, optional: bool, desc: str) -> Any:
        option = OpSchema.FormalParameterOption.Optional if optional else OpSchema.FormalParameterOption.Single
        return OpSchema.FormalParameter(n, t, desc, param_option=option)

    kinds = {"int": OpSchema.AttrType.INT, "float": OpSchema.AttrType.FLOAT, "string": OpSchema.AttrType.STRING}
    attrs = []
    for a in spec.attributes:
        if a.default is None or not defaults:
            attrs.append(OpSchema.Attribute(a.name, kinds[a.kind], a.doc, required=a.default is None and defaults))
        else:
            attrs.append(OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, a.default), a.doc))
    schema = OpSchema(
        spec.name,
        OP_DOMAIN,
        OP_VERSION,
        spec.doc,
        inputs=[param(t.name, t.type, t.optional, t.doc) for t in spec.inputs],
        outputs=[param(t.name, t.type, t.optional, t.doc) for t in spec.outputs],
        type_constraints=[(c.name, list(c.types), c.doc) for c in spec.type_constraints],
        attributes=attrs,
    )
    if infer is not None:
        schema.set_type_and_shape_inference_function(infer)
    return schema


def attr_int(ctx: Any, name: str) -> int | None:
    """Integer attribute ``name`` of the node being inferred, None when absent."""
    a = ctx.get_attribute(name)
    return None if a is None else int(a.i)


def dims(type_proto: Any) -> list[int | None] | None:
    """Static dims of a tensor type (None for unknown dims), or None when the rank is unknown."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]


def check_dims(op: str, name: str, got: list[int | None] | None, expected: list[int | None]) -> None:
    """Raise ``onnx.shape_inference.InferenceError`` when a known dim of ``got`` contradicts ``expected``."""
    from onnx.shape_inference import InferenceError

    if got is None:
        return
    if len(got) != len(expected):
        raise InferenceError(f"trtpipe::{op}: input {name} has rank {len(got)}, expected {len(expected)} ({expected})")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g is not None and e is not None and g != e:
            raise InferenceError(
                f"trtpipe::{op}: input {name} dim {i} is {g}, expected {e} (shape {got} vs {expected}); "
                "the node's attributes and the tensor shapes disagree"
            )


def copy_type(ctx: Any, src_idx: int, dst_idx: int) -> None:
    """Output ``dst_idx`` gets the type (and shape) of input ``src_idx``, when that is known."""
    import onnx

    t = ctx.get_input_type(src_idx)
    if t is None:
        return
    out = onnx.TypeProto()
    out.CopyFrom(t)
    ctx.set_output_type(dst_idx, out)
