"""Lower exported ``trtpipe`` graphs for TensorRT's ONNX parser.

Passes (each ``ModelProto -> ModelProto``, returning a new model; idempotent):

* :func:`cast_float_graph` -- the exported graphs are fp32; GPU phases run fp16 (or bf16)
  activations. Float initializers, constants, graph inputs and ``present_*`` outputs take the
  target dtype; int64 index tensors are untouched. RMSNorm statistics (``Pow -> ReduceMean ->
  Add -> Sqrt -> Reciprocal``) stay fp32 islands, because a squared fp16 activation overflows at
  |x| > 255; ``logits`` stay fp32 (one Cast on ``[S, V]``) for the sampler.
* :func:`lower_with_plugins` -- custom nodes become TensorRT plugin nodes (op type = plugin
  creator name, attributes ``plugin_namespace`` / ``plugin_version``, see TOOLCHAIN.md). A
  Python AOT plugin launches exactly one kernel, so ``PagedAttention`` (write-then-attend) is
  split into two plugin nodes::

      key, value, key_cache, value_cache, slot_mapping
            │
      PagedKVWrite ──► key_cache_out, value_cache_out   (aliased to the inputs: in place)
            │
      query ─┴► PagedAttention(decode=0|1) ──► output     (reads the updated pool)

  ``decode=1`` (the split layout's decode graph: one token per sequence) selects the decode
  kernel; ``decode=0`` the ragged prefill kernel. ``Int4Gemm`` keeps its node; zero points are
  always given as a float tensor (uint8 zero points are unpacked, absent ones become 8), so the
  plugin has one fixed signature. ``Int4Gemm`` with ``bits=8`` (an 8-bit LM head) becomes a
  float ``MatMul`` in both lowerings (no 8-bit block kernel or TensorRT block format).
* :func:`lower_plugin_free` -- no custom node left (TensorRT < 10.7 on JetPack 6, the
  TensorRT-RTX smoke build): ``PagedAttention`` in standard ONNX ops (``ScatterND`` write,
  ``Gather`` by block table, causal + window masks; shared with the ONNX Runtime lowering,
  :mod:`trtpipe.plugins.ort_lowering`) and ``Int4Gemm`` as blockwise INT4 ``DequantizeLinear`` +
  ``MatMul``. TensorRT's INT4 dequantization is symmetric only (zero point 0), so asymmetric
  weights (per-block zero points != 8, e.g. GGUF Q4_1) raise :class:`OpError`, or, when asked,
  are re-quantized to symmetric blocks of the same group size (least-squares scale per block)
  or stored dequantized as float weights of a plain ``MatMul``.

  Cost of going plugin-free: TensorRT's ``ScatterND`` writes a new output tensor, so each step
  copies every layer's pool (the plugin writes in place); attention reads ``MB * block_size``
  keys per sequence. Fine for a smoke build and small pools; the plugins are the fast path.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtpipe.plugins import OP_DOMAIN, PLUGIN_VERSION
from trtpipe.plugins.errors import OpError

PLUGIN_NAMESPACE = "trtpipe"
# plugin creator name -> the attributes its node carries (besides plugin_namespace/version);
# trt_plugins.py registers exactly these.
PLUGIN_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "PagedKVWrite": ("num_kv_heads", "head_size", "block_size"),
    "PagedAttention": ("num_heads", "num_kv_heads", "head_size", "scale", "block_size", "sliding_window",
                       "decode"),
    "Int4Gemm": ("K", "N", "group_size", "bits"),
}
FLOAT_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16, "fp32": TensorProto.FLOAT}
_CAST_MARK = "trtpipe.float_dtype"  # metadata_props key: the cast pass ran (idempotence)
_NORM_CHAIN_OPS = ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Div")


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _np_float(dtype: str):
    if dtype == "fp16":
        return np.float16
    if dtype == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.float32


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove initializers no node reads (e.g. packed INT4 weights replaced by a dequantized form)."""
    g = model.graph
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def _drop_custom_domain(model: onnx.ModelProto) -> None:
    """Remove the ``trtpipe`` opset import and any onnxscript functions of that domain."""
    keep = [o for o in model.opset_import if o.domain != OP_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    keep_f = [f for f in model.functions if f.domain != OP_DOMAIN]
    del model.functions[:]
    model.functions.extend(keep_f)


# ============================================================================================
# fp16 / bf16 cast pass
# ============================================================================================


def _non_float_constants(model: onnx.ModelProto) -> set[str]:
    """Initializers and Constant outputs whose type is not float32 (axes, shapes, indices)."""
    out = {t.name for t in model.graph.initializer if t.data_type != TensorProto.FLOAT}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type != TensorProto.FLOAT:
                    out.update(n.output)
    return out


def _norm_islands(graph: onnx.GraphProto) -> set[int]:
    """Indices of nodes in RMSNorm statistic chains: Pow -> (ReduceMean|Add|Sqrt|Reciprocal|Div)*,
    each link the single consumer of the previous output."""
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for x in n.input:
            consumers.setdefault(x, []).append(i)
    keep: set[int] = set()
    for i, n in enumerate(graph.node):
        if n.op_type != "Pow":
            continue
        chain, cur = [i], n
        while len(consumers.get(cur.output[0], [])) == 1:
            j = consumers[cur.output[0]][0]
            nxt = graph.node[j]
            if nxt.op_type not in _NORM_CHAIN_OPS:
                break
            chain.append(j)
            cur = nxt
        if any(graph.node[j].op_type == "ReduceMean" for j in chain):
            keep.update(chain)
    return keep


def cast_float_graph(model: onnx.ModelProto, dtype: str = "fp16", *, kv_dtype: str | None = None,
                     keep_fp32_outputs: tuple[str, ...] = ("logits",)) -> onnx.ModelProto:
    """Convert an fp32 graph to ``dtype`` ("fp16" | "bf16") activations and weights.

    ``kv_dtype`` (default: ``dtype``) must equal ``dtype``: the pool is read and written by the
    same layers. Outputs named in ``keep_fp32_outputs`` stay float32 through a final Cast.
    A graph this pass already cast (``metadata_props["trtpipe.float_dtype"]``) is returned
    unchanged (idempotent).

    Raises :class:`OpError` for an unknown dtype or a KV dtype different from ``dtype``.
    """
    if dtype == "fp32":
        return _copy(model)
    if dtype not in FLOAT_TYPES:
        raise OpError(f"cast dtype {dtype!r}: expected one of {sorted(FLOAT_TYPES)}")
    if (kv_dtype or dtype) != dtype:
        raise OpError(f"kv_cache.dtype {kv_dtype} differs from the activation dtype {dtype}: the TensorRT "
                      f"graphs read and write the pool in the activation dtype. Fix: set kv_cache.dtype: {dtype}.")
    to = FLOAT_TYPES[dtype]
    npt = _np_float(dtype)
    out = _copy(model)
    done = {p.key: p.value for p in out.metadata_props}.get(_CAST_MARK)
    if done == dtype:
        return out
    if done is not None:
        raise OpError(f"graph already cast to {done}; cast the fp32 graph to {dtype} instead")
    g = out.graph
    not_float = _non_float_constants(out)
    island = _norm_islands(g)
    island_tensors = {o for i in island for o in g.node[i].output}
    # tensors read only by island nodes stay fp32 (eps, the exponent 2)
    readers: dict[str, set[bool]] = {}
    for i, n in enumerate(g.node):
        for x in n.input:
            readers.setdefault(x, set()).add(i in island)
    only_island = {name for name, kinds in readers.items() if kinds == {True}}

    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in only_island:
            arr = numpy_helper.to_array(t).astype(npt)
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
    new_nodes: list[onnx.NodeProto] = []
    for i, n in enumerate(g.node):
        in_island = i in island
        if in_island:
            for k, x in enumerate(n.input):
                if x and x not in not_float and x not in island_tensors and x not in only_island:
                    c = f"{x}/to_fp32"
                    if not any(m.output[0] == c for m in new_nodes):
                        new_nodes.append(helper.make_node("Cast", [x], [c], name=c, to=TensorProto.FLOAT))
                    n.input[k] = c
        else:
            for k, x in enumerate(n.input):
                if x in island_tensors:
                    c = f"{x}/to_{dtype}"
                    if not any(m.output[0] == c for m in new_nodes):
                        new_nodes.append(helper.make_node("Cast", [x], [c], name=c, to=to))
                    n.input[k] = c
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value" and a.t.data_type == TensorProto.FLOAT and not set(n.output) <= only_island:
                        a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(npt), a.t.name))
            for a in n.attribute:
                if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = to
                if n.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(npt), a.t.name))
        new_nodes.append(n)
    # graph inputs / outputs
    for vi in g.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = to
    for vi in g.output:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if vi.name in keep_fp32_outputs:
            inner = f"{vi.name}/{dtype}"
            for n in new_nodes:
                for k, x in enumerate(n.output):
                    if x == vi.name:
                        n.output[k] = inner
                for k, x in enumerate(n.input):
                    if x == vi.name:
                        n.input[k] = inner
            new_nodes.append(helper.make_node("Cast", [inner], [vi.name], name=f"{vi.name}/to_fp32",
                                              to=TensorProto.FLOAT))
        else:
            vi.type.tensor_type.elem_type = to
    del g.node[:]
    g.node.extend(new_nodes)
    del g.value_info[:]  # stale float32 types; TensorRT infers its own
    out.metadata_props.add(key=_CAST_MARK, value=dtype)
    return out


# ============================================================================================
# plugin lowering
# ============================================================================================


def _plugin_node(op_type: str, inputs: list[str], outputs: list[str], name: str, attrs: dict,
                 namespace: str, version: str) -> onnx.NodeProto:
    want = PLUGIN_ATTRIBUTES[op_type]
    kw = {k: attrs[k] for k in want}
    return helper.make_node(op_type, inputs, outputs, name=name, domain=OP_DOMAIN,
                            plugin_namespace=namespace, plugin_version=version, **kw)


def _float_zero_points(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], extra: list,
                       n_groups: int, N: int) -> str:
    """The node's zero points as a float initializer name (scales' dtype)."""
    scales = inits.get(node.input[2])
    if scales is None:
        raise OpError(f"Int4Gemm {node.name}: scales {node.input[2]!r} must be an initializer (weights are "
                      "constant). Fix: export with the weights as initializers.")
    fdt = numpy_helper.to_array(scales).dtype
    zp_name = node.input[3] if len(node.input) > 3 else ""
    if not zp_name:
        zp = np.full((N, n_groups), 8, fdt)
    else:
        t = inits.get(zp_name)
        if t is None:
            raise OpError(f"Int4Gemm {node.name}: zero_points {zp_name!r} must be an initializer")
        if t.data_type != TensorProto.UINT8:
            return zp_name
        packed = numpy_helper.to_array(t)
        zp = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(N, -1)[:, :n_groups].astype(fdt)
    name = f"{node.name or node.output[0]}/zero_points_float"
    extra.append(numpy_helper.from_array(zp, name))
    return name


def lower_with_plugins(model: onnx.ModelProto, *, decode: bool = False, namespace: str = PLUGIN_NAMESPACE,
                       version: str = PLUGIN_VERSION) -> onnx.ModelProto:
    """Rewrite ``trtpipe`` nodes into TensorRT plugin nodes (see the module docstring).

    ``decode``: the graph has one query token per sequence (the split layout's decode graph), so
    attention uses the decode kernel. Idempotent: plugin nodes already carrying
    ``plugin_namespace`` are left alone. Raises :class:`OpError` for an unknown ``trtpipe`` op.
    """
    out = _copy(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    extra: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for node in g.node:
        a = _attrs(node)
        if node.domain != OP_DOMAIN or "plugin_namespace" in a:
            nodes.append(node)
            continue
        base = node.name or node.output[0]
        if node.op_type == "PagedAttention":
            q, k, v, kc, vc, slot, bt, cl, qsl = node.input[:9]
            o, kc_out, vc_out = node.output
            nodes.append(_plugin_node("PagedKVWrite", [k, v, kc, vc, slot], [kc_out, vc_out], f"{base}/kv_write",
                                      a, namespace, version))
            a = {**a, "scale": float(a.get("scale", 0.0)), "sliding_window": int(a.get("sliding_window", 0)),
                 "decode": int(decode)}
            nodes.append(_plugin_node("PagedAttention", [q, kc_out, vc_out, bt, cl, qsl], [o], f"{base}/attention",
                                      a, namespace, version))
        elif node.op_type == "Int4Gemm" and int(a.get("bits", 4)) == 8:
            from trtpipe.plugins.ort_lowering import _Builder

            b = _Builder(base)
            _lower_int8_gemm_float(b, node, inits)
            nodes.extend(b.nodes)
            extra.extend(b.inits)
        elif node.op_type == "Int4Gemm":
            K, N, G = a["K"], a["N"], a["group_size"]
            zp = _float_zero_points(node, inits, extra, K // G, N)
            a = {**a, "bits": int(a.get("bits", 4))}
            nodes.append(_plugin_node("Int4Gemm", list(node.input[:3]) + [zp], list(node.output), base, a,
                                      namespace, version))
        else:
            raise OpError(f"no TensorRT plugin for {OP_DOMAIN}::{node.op_type} (node {node.name}); "
                          f"plugins exist for {sorted(PLUGIN_ATTRIBUTES)}")
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(extra)
    _drop_unused_initializers(out)
    keep_f = [f for f in out.functions if f.domain != OP_DOMAIN]
    del out.functions[:]
    out.functions.extend(keep_f)
    if not any(o.domain == OP_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(OP_DOMAIN, 1))
    return out


# ============================================================================================
# plugin-free lowering
# ============================================================================================


def _int4_tensor(values: np.ndarray, name: str) -> onnx.TensorProto:
    """Signed INT4 initializer from int values in [-8, 7] (ONNX packs two per byte, low nibble
    first, in row-major order)."""
    import ml_dtypes

    return numpy_helper.from_array(np.ascontiguousarray(values.astype(np.int8)).astype(ml_dtypes.int4), name)


ASYMMETRIC_INT4_MODES = ("refuse", "requantize_symmetric", "dequantize_float")


def _lower_int4_gemm_dq(b, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], *,
                        asymmetric_int4: str = "refuse") -> None:
    """``Int4Gemm`` -> ``MatMul(A, DequantizeLinear(W_int4 [K, N], scale [K/G, N], axis=0,
    block_size=G))``. Symmetric only (zero point 8 everywhere), see the module docstring.
    Asymmetric blocks (``asymmetric_int4``): ``refuse`` raises; ``requantize_symmetric``
    re-quantizes them (:func:`~trtpipe.plugins.int4_pack.requantize_symmetric`, same group size);
    ``dequantize_float`` writes ``MatMul(A, W^T)`` with W dequantized at lowering time (exact up
    to the float rounding; the cast pass then stores it in the activation dtype)."""
    from trtpipe.plugins.reference import unpack_int4_codes, unpack_zero_points_uint8

    a = _attrs(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    nb = K // G
    try:
        packed = numpy_helper.to_array(inits[node.input[1]])
        scales = numpy_helper.to_array(inits[node.input[2]])
    except KeyError as e:
        raise OpError(f"Int4Gemm {node.name}: {e} must be an initializer (load the graph with its external "
                      "data before lowering)") from None
    zp_name = node.input[3] if len(node.input) > 3 else ""
    if zp_name:
        zt = numpy_helper.to_array(inits[zp_name])
        zp = unpack_zero_points_uint8(zt, N, nb).astype(np.float32) if zt.dtype == np.uint8 else zt.astype(np.float32)
    else:
        zp = np.full((N, nb), 8.0, np.float32)
    if asymmetric_int4 not in ASYMMETRIC_INT4_MODES:
        raise OpError(f"asymmetric_int4 = {asymmetric_int4!r}: expected one of {ASYMMETRIC_INT4_MODES}")
    if not np.all(zp == 8.0) and asymmetric_int4 == "dequantize_float":
        from trtpipe.plugins.reference import dequantize_int4

        raw_zp = numpy_helper.to_array(inits[zp_name])
        w = dequantize_int4(packed, scales, raw_zp, K, N, G)  # [N, K] float32
        name = b.name("w_dequantized")
        b.inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(scales.dtype)), name))  # [K, N]
        b.op("MatMul", [node.input[0], name], "matmul", outputs=list(node.output))
        return
    if not np.all(zp == 8.0) and asymmetric_int4 == "requantize_symmetric":
        from trtpipe.plugins.int4_pack import requantize_symmetric

        raw_zp = numpy_helper.to_array(inits[zp_name])
        packed, sym_scales = requantize_symmetric(packed, scales, raw_zp, K, N, G)
        scales = sym_scales.astype(scales.dtype)
        zp = np.full((N, nb), 8.0, np.float32)
    if not np.all(zp == 8.0):
        bad = int(np.sum(zp != 8.0))
        raise OpError(
            f"Int4Gemm {node.name} (output {node.output[0]}, K={K}, N={N}, group_size={G}) has asymmetric INT4 weights ({bad} of {zp.size} "
            "blocks have a zero point other than 8), and TensorRT's INT4 DequantizeLinear is symmetric only, so "
            "the plugin-free lowering cannot express them. Fix: use the Int4Gemm plugin (engine.plugin_free: false, "
            "TensorRT >= 10.7), or let the plugin-free variant re-quantize them symmetrically "
            "(engine.plugin_free_int4: requantize_symmetric) or store them dequantized in fp16 "
            "(engine.plugin_free_int4: dequantize_float), gated by "
            "validate.correctness.plugin_free_teacher_forced_agreement_min), or re-quantize every variant "
            "(precision.int4.symmetric: true; a GGUF Q4_1 file is asymmetric and is repacked as is at group_size "
            "32, so pick group_size 64 or 128 to re-quantize), or run that phase in fp16.")
    codes = unpack_int4_codes(packed, K, N, G).astype(np.int16) - 8  # [N, K] in [-8, 7]
    w = b.name("w_int4")
    s = b.name("w_scale")
    b.inits.append(_int4_tensor(codes.T, w))  # [K, N]
    b.inits.append(numpy_helper.from_array(np.ascontiguousarray(scales.T), s))  # [K/G, N], scales' dtype
    dq = b.op("DequantizeLinear", [w, s], "dequantize", axis=0, block_size=G)
    b.op("MatMul", [node.input[0], dq], "matmul", outputs=list(node.output))


def _lower_int8_gemm_float(b, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> None:
    """``Int4Gemm`` with ``bits=8`` (an 8-bit LM head, e.g. GGUF Q8_0: codes ``[N, K/G, G]``
    bytes, zero point 128 by default) -> ``MatMul(A, W^T)`` with W dequantized at lowering time.
    Neither the Int4Gemm plugin nor TensorRT's block quantization (INT4/FP8 only) takes 8-bit
    blocks; a float weight is exact up to the float rounding of ``(q - zp) * scale``."""
    a = _attrs(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    nb = K // G
    try:
        codes = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32).reshape(N, nb, G)
        scales = numpy_helper.to_array(inits[node.input[2]])
    except KeyError as e:
        raise OpError(f"Int4Gemm {node.name} (bits=8): {e} must be an initializer") from None
    zp_name = node.input[3] if len(node.input) > 3 else ""
    zp = (numpy_helper.to_array(inits[zp_name]).astype(np.float32).reshape(N, nb) if zp_name
          else np.full((N, nb), 128.0, np.float32))
    w = ((codes - zp[:, :, None]) * scales.astype(np.float32)[:, :, None]).reshape(N, K)
    name = b.name("w_dequantized")
    b.inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(scales.dtype)), name))  # [K, N]
    b.op("MatMul", [node.input[0], name], "matmul", outputs=list(node.output))


def lower_plugin_free(model: onnx.ModelProto, *, decode: bool = False,
                      asymmetric_int4: str = "refuse") -> onnx.ModelProto:
    """Rewrite every ``trtpipe`` node into standard ONNX ops TensorRT parses without plugins.

    ``decode``: one query token per sequence (the split layout's decode graph), which takes the
    ONNX Runtime lowering's decode-specialized attention (no padded query layout).
    ``asymmetric_int4``: what asymmetric INT4 weights become (see :func:`_lower_int4_gemm_dq`):
    ``refuse``, ``requantize_symmetric`` (not exact; the build measures the model's agreement) or
    ``dequantize_float``.
    Raises :class:`OpError` for asymmetric INT4 weights (unless re-quantized) or an unknown
    ``trtpipe`` op.
    Idempotent (a lowered graph has no ``trtpipe`` node).
    """
    from trtpipe.plugins import ort_lowering as OL
    from trtpipe.plugins.ort_lowering import _Builder

    if decode:
        index_subgraph = lambda ib, slot, bt, cl, qsl, block_size: OL._decode_index_subgraph(  # noqa: E731
            ib, slot, bt, cl, block_size=block_size)
        lower_attention = OL._lower_paged_attention_decode
    else:
        index_subgraph, lower_attention = OL._index_subgraph, OL._lower_paged_attention

    out = _copy(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    nodes: list[onnx.NodeProto] = []
    extra: list[onnx.TensorProto] = []
    shared: dict[tuple, dict[str, str]] = {}
    masks: dict[tuple, dict] = {}
    for node in g.node:
        if node.domain != OP_DOMAIN:
            nodes.append(node)
            continue
        b = _Builder(node.name or node.op_type)
        if node.op_type == "PagedAttention":
            key = (tuple(node.input[5:9]), _attrs(node)["block_size"])
            if key not in shared:
                ib = _Builder("/model/paged_attention_index")
                shared[key] = index_subgraph(ib, *node.input[5:9], block_size=key[1])
                nodes.extend(ib.nodes)
                extra.extend(ib.inits)
                masks[key] = {}
            lower_attention(b, node, shared[key], masks[key])
        elif node.op_type == "Int4Gemm" and int(_attrs(node).get("bits", 4)) == 8:
            _lower_int8_gemm_float(b, node, inits)
        elif node.op_type == "Int4Gemm":
            _lower_int4_gemm_dq(b, node, inits, asymmetric_int4=asymmetric_int4)
        else:
            raise OpError(f"no plugin-free TensorRT lowering for {OP_DOMAIN}::{node.op_type} (node {node.name})")
        nodes.extend(b.nodes)
        extra.extend(b.inits)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(extra)
    _drop_unused_initializers(out)
    _drop_custom_domain(out)
    for o in out.opset_import:  # blockwise DequantizeLinear needs opset >= 21
        if o.domain in ("", "ai.onnx") and o.version < 21:
            o.version = 21
    return out


def lower_for_trt(model: onnx.ModelProto, *, dtype: str, plugin_free: bool, decode: bool = False,
                  kv_dtype: str | None = None, asymmetric_int4: str = "refuse") -> onnx.ModelProto:
    """The whole TensorRT lowering of one exported fp32 graph: custom ops (plugins or
    plugin-free, the latter optionally re-quantizing asymmetric INT4 weights), then the float
    cast to ``dtype`` ("fp32" | "fp16" | "bf16")."""
    lowered = (lower_plugin_free(model, decode=decode, asymmetric_int4=asymmetric_int4) if plugin_free
               else lower_with_plugins(model, decode=decode))
    return cast_float_graph(lowered, dtype, kv_dtype=kv_dtype)


def custom_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(op_type, name)`` of every node in the ``trtpipe`` domain (empty after plugin-free lowering)."""
    return [(n.op_type, n.name) for n in model.graph.node if n.domain == OP_DOMAIN]
