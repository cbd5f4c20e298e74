"""The node-rewrite walk every lowering of ``trtpipe`` custom nodes shares.

A lowering (ONNX Runtime, TensorRT with plugins, TensorRT plugin-free) is a function
``ModelProto -> ModelProto`` that copies the model, walks its nodes in order, keeps every node
outside the ``trtpipe`` domain as it is, and replaces each custom node by the nodes and
initializers a per-op rewrite emits::

    graph.node:   n0  n1  [trtpipe::X]  n3  [trtpipe::Y]  ...
                           │                 │
                  rewrite(node, GraphRewrite) appends nodes / initializers in place
                           ▼                 ▼
    new node list: n0  n1  x.a x.b  n3  (shared index nodes, once)  y.a ...

Emitted nodes land at the custom node's position, so the topological order holds as long as a
rewrite only reads tensors defined before that node (index tensors shared by several layers are
emitted once, before the first layer that reads them: see ``GraphRewrite.memo``).

:func:`finish_lowering` applies the cleanups each lowering ends with (unused initializers, the
custom opset and the onnxscript functions of the domain). ``NodeBuilder`` names nodes
``<prefix>/<hint>_<n>`` (stable names, like ORT-GenAI's ``/model/layers.3/attn/...``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.core.errors import OpError

__all__ = [
    "NodeBuilder",
    "GraphRewrite",
    "node_attributes",
    "copy_model",
    "rewrite_custom_nodes",
    "ensure_opset",
    "drop_unused_initializers",
    "drop_custom_domain",
    "finish_lowering",
    "InitializerView",
]


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """``{attribute name: Python value}`` of ``node`` (ints, floats, strings, tensors, lists)."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy (passes return new models; the input is never mutated)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


class NodeBuilder:
    """Appends nodes and initializers with unique, stable names under ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        """``<prefix>/<hint>_<n>``, n counting every name this builder handed out."""
        self._n += 1
        return f"{self.prefix}/{hint}_{self._n}"

    def op(
        self,
        op_type: str,
        inputs: list[str],
        hint: str | None = None,
        n_out: int = 1,
        domain: str = "",
        outputs: list[str] | None = None,
        **attrs: Any,
    ) -> Any:
        """Append one node; returns its output name (``n_out == 1``) or the list of names.
        ``outputs`` names the outputs explicitly (e.g. the custom node's own output names)."""
        nm = self.name(hint or op_type)
        outs = outputs or [f"{nm}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=nm, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: Any, dtype: Any = np.int64, hint: str = "c") -> str:
        """Append an initializer holding ``np.asarray(value, dtype)``; returns its name."""
        nm = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), nm))
        return nm


@dataclass
class GraphRewrite:
    """The new node list under construction, handed to each per-node rewrite.

    ``memo``: per-graph state a rewrite shares across nodes (e.g. PagedAttention index tensors
    keyed by their inputs, built once for all layers)."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    memo: dict[Any, Any] = field(default_factory=dict)

    def emit(self, builder: NodeBuilder) -> None:
        """Append what ``builder`` holds, in its order."""
        self.nodes.extend(builder.nodes)
        self.initializers.extend(builder.inits)


NodeRewrite = Callable[[onnx.NodeProto, GraphRewrite], None]


def rewrite_custom_nodes(
    model: onnx.ModelProto, rewrite: NodeRewrite, *, keep: Callable[[onnx.NodeProto], bool] | None = None
) -> onnx.ModelProto:
    """A copy of ``model`` whose ``trtpipe`` nodes are replaced by what ``rewrite(node, state)``
    appends to ``state``; other nodes (and custom nodes for which ``keep(node)`` is true) stay.
    New initializers are appended after the existing ones. Errors are the rewrite's."""
    out = copy_model(model)
    g = out.graph
    state = GraphRewrite()
    for node in g.node:
        if node.domain != OP_DOMAIN or (keep is not None and keep(node)):
            state.nodes.append(node)
            continue
        rewrite(node, state)
    del g.node[:]
    g.node.extend(state.nodes)
    g.initializer.extend(state.initializers)
    return out


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove initializers no node reads and no graph output names (replaced codes and scales,
    unused zero points), so they are not written to the weights file. In place."""
    g = model.graph
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def drop_custom_domain(model: onnx.ModelProto, *, opset: bool = True) -> None:
    """Remove the onnxscript functions of the ``trtpipe`` domain and (``opset``) its opset
    import. In place."""
    if opset:
        keep = [o for o in model.opset_import if o.domain != OP_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    keep_f = [f for f in model.functions if f.domain != OP_DOMAIN]
    del model.functions[:]
    model.functions.extend(keep_f)


def ensure_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """Import ``domain`` at ``version`` unless the model already imports it. In place."""
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


def finish_lowering(model: onnx.ModelProto, *, keep_custom_opset: bool = False) -> onnx.ModelProto:
    """The cleanups every lowering ends with: unused initializers dropped, the custom domain's
    functions dropped, and its opset import dropped unless ``keep_custom_opset`` (plugin nodes
    stay in the ``trtpipe`` domain). In place; returns ``model``."""
    drop_unused_initializers(model)
    drop_custom_domain(model, opset=not keep_custom_opset)
    if keep_custom_opset:
        ensure_opset(model, OP_DOMAIN, 1)
    return model


class InitializerView:
    """Lazy name -> numpy view of a graph's initializers (external data must be loaded)."""

    def __init__(self, graph: onnx.GraphProto):
        self._protos = {t.name: t for t in graph.initializer}
        self._cache: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray | None:
        if name not in self._protos:
            return None
        if name not in self._cache:
            self._cache[name] = numpy_helper.to_array(self._protos[name])
        return self._cache[name]

    def __getitem__(self, name: str) -> np.ndarray:
        v = self.get(name)
        if v is None:
            raise OpError(f"initializer {name!r} not found: load the model with its external data before lowering")
        return v
