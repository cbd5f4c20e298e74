"""The torch exporter's translation of an op into one ``trtpipe`` node, built from the op's
description (the ``custom_translation_table`` entries of ``torch.onnx.export(dynamo=True)``).

``torch.onnx`` calls a translation with the FX node's arguments (trailing arguments equal to the
torch schema's defaults left out) while an onnxscript evaluator records nodes. It reads the
translation's parameter list with ``inspect.signature`` + ``typing.get_type_hints`` (torch 2.13,
``_schemas.op_signature_from_function``), so :func:`translation` gives it the op's "positional"
signature (:meth:`~trtpipe.plugins.ops.spec.OpSpec.python_signature`) with annotations from the
description: onnxscript tensor types per type constraint (a ``TypeVar`` where a constraint allows
several), ``int`` / ``float`` / ``str`` per attribute.

The body emits the node through an ``OpSchema`` built WITHOUT attribute defaults
(:func:`~trtpipe.plugins.ops.onnx_schema.build_schema` with ``defaults=False``): the recorder
fills in a schema's defaults, and the node must carry only the op's arguments (a
``plugin_namespace`` attribute marks a node the TensorRT lowering already rewrote). Absent
trailing optional inputs are dropped, as ONNX spells them.

Imports onnxscript (build side only).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import onnxscript
from onnxscript import BFLOAT16, FLOAT, FLOAT16, INT8, INT64, UINT8

from trtpipe.plugins import OP_DOMAIN, OP_VERSION
from trtpipe.plugins.ops.onnx_schema import build_schema
from trtpipe.plugins.ops.spec import OpSpec

__all__ = ["translation", "translation_annotations"]

_ONNXSCRIPT_TYPES = {
    "tensor(float)": FLOAT,
    "tensor(float16)": FLOAT16,
    "tensor(bfloat16)": BFLOAT16,
    "tensor(int8)": INT8,
    "tensor(int64)": INT64,
    "tensor(uint8)": UINT8,
}


def translation_annotations(spec: OpSpec) -> dict[str, Any]:
    """``{parameter: annotation, "return": ...}`` of the op's translation function."""
    types: dict[str, Any] = {}
    for c in spec.type_constraints:
        ts = [_ONNXSCRIPT_TYPES[t] for t in c.types]
        types[c.name] = ts[0] if len(ts) == 1 else typing.TypeVar(c.name, *ts)
    optional = typing.Optional  # built at run time from the description; the exporter reads Optional[...]
    ann: dict[str, Any] = {t.arg_name: optional[types[t.type]] if t.optional else types[t.type] for t in spec.inputs}
    ann.update({a.name: a.py_type for a in spec.arguments})
    outs = tuple(types[t.type] for t in spec.outputs if not t.optional)  # the torch op's (OpSpec.torch_schema)
    ann["return"] = outs[0] if len(outs) == 1 else tuple.__class_getitem__(outs)
    return ann


def translation(spec: OpSpec) -> Callable[..., Any]:
    """``<torch_name>_onnx(*args)``: one ``trtpipe::<spec.name>`` node (see the module docstring)."""
    node = onnxscript.values.Op(
        onnxscript.values.Opset(OP_DOMAIN, OP_VERSION), spec.name, build_schema(spec, defaults=False)
    )

    def translate(*args: Any, **kwargs: Any) -> Any:
        a = spec.bind(args, kwargs, style="positional")
        inputs = [getattr(a, t.arg_name) for t in spec.inputs]
        while inputs and inputs[-1] is None:  # an absent optional input
            inputs.pop()
        return node(*inputs, **{x.name: getattr(a, x.name) for x in spec.arguments})

    ann = translation_annotations(spec)
    sig = spec.python_signature("positional")
    translate.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=ann[p.name]) for p in sig.parameters.values()], return_annotation=ann["return"]
    )
    translate.__annotations__ = ann
    translate.__name__ = translate.__qualname__ = f"{spec.torch_name}_onnx"
    translate.__doc__ = f"torch exporter translation of trtpipe::{spec.name}: {inspect.cleandoc(spec.doc)}"
    return translate
