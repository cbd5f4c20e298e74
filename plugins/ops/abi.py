"""ONNX schemas of the ``trtpipe`` custom ops (domain "trtpipe", version 1) and their ABI hash.

The op signatures are plain data (:data:`OP_SPECS`), so :func:`op_schema_abi_hash` works without
onnx installed (the runtime checks a manifest's hash on the embedded target). :func:`register_schemas`
turns the data into ``onnx.defs.OpSchema`` objects with a Python type-and-shape inference
function and registers them (idempotent), after which ``onnx.checker.check_model`` and
``onnx.shape_inference.infer_shapes(strict_mode=True)`` accept graphs with these nodes.

Shape inference (see ``docs/contracts.md``):
  - PagedAttention: output has query's type and shape; key_cache_out / value_cache_out have the
    key_cache / value_cache type and shape.
  - Int4Gemm: Y has A's type and shape ``A.shape[:-1] + [N]``.
Statically known dims that contradict the attributes (e.g. query's last dim != num_heads *
head_size, B != [N, K/G, G/2]) raise ``onnx.shape_inference.InferenceError``.

Besides the contract's attributes, both ops accept the optional string attributes
``plugin_namespace`` / ``plugin_version`` that TensorRT's ONNX parser reads to find the plugin
creator; they do not change the op's meaning.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trtpipe.plugins import OP_DOMAIN, OP_VERSION

__all__ = ["OP_SPECS", "register_schemas", "infer_trtpipe_shapes", "op_schema_abi_hash", "op_schema_canonical_text"]

_FLOATS = ["tensor(float)", "tensor(float16)"]

# Inputs/outputs: (name, type_str, optional, description). Attributes: (name, kind, default,
# description) with default None = required. Type constraints: (name, allowed types, description).
OP_SPECS: dict[str, dict[str, Any]] = {
    "PagedAttention": {
        "doc": (
            "Writes this step's K/V into the paged KV pool at slot_mapping, then causal GQA "
            "attention of the packed ragged queries over the pool through block tables, with an "
            "optional Hugging Face sliding window. Reference: trtpipe.plugins.ops.paged_attention.reference.paged_attention."
        ),
        "inputs": [
            ("query", "T", False, "[T, H*D], RoPE applied"),
            ("key", "T", False, "[T, KVH*D] new tokens' K, RoPE applied"),
            ("value", "T", False, "[T, KVH*D] new tokens' V"),
            ("key_cache", "T_CACHE", False, "[KVH, NB, BS, D] head-major"),
            ("value_cache", "T_CACHE", False, "[KVH, NB, BS, D]"),
            ("slot_mapping", "T_INDEX", False, "[T] where token t is written: block_id*BS + pos % BS"),
            ("block_tables", "T_INDEX", False, "[S, MB] logical -> physical block; padding 0"),
            ("context_lens", "T_INDEX", False, "[S] tokens in the pool after this step"),
            ("query_start_loc", "T_INDEX", False, "[S+1] packed offsets of each sequence"),
        ],
        "outputs": [
            ("output", "T", False, "[T, H*D]"),
            ("key_cache_out", "T_CACHE", False, "key_cache with this step's K written (aliased in place)"),
            ("value_cache_out", "T_CACHE", False, "value_cache with this step's V written (aliased in place)"),
        ],
        "type_constraints": [
            ("T", _FLOATS, "query/key/value/output"),
            ("T_CACHE", _FLOATS, "KV pool"),
            ("T_INDEX", ["tensor(int64)"], "indices"),
        ],
        "attributes": [
            ("num_heads", "int", None, "H"),
            ("num_kv_heads", "int", None, "KVH; num_heads % num_kv_heads == 0"),
            ("head_size", "int", None, "D"),
            ("scale", "float", 0.0, "softmax scale; 0 means 1/sqrt(head_size)"),
            ("block_size", "int", None, "BS, tokens per KV block"),
            ("sliding_window", "int", 0, "W; 0 = off; query at p sees keys p-W < j <= p"),
            ("plugin_namespace", "string", "", "TensorRT plugin namespace (no semantic effect)"),
            ("plugin_version", "string", "1", "TensorRT plugin version (no semantic effect)"),
        ],
    },
    "Int4Gemm": {
        "doc": (
            "Y[..., N] = A[..., K] @ W^T with W[N, K] = (q - zp) * scale blockwise along K "
            "(com.microsoft::MatMulNBits packing). Reference: trtpipe.plugins.ops.paged_attention.reference.int4_gemm."
        ),
        "inputs": [
            ("A", "T", False, "[..., K]"),
            ("B", "T_UINT8", False, "[N, K/G, G/2] packed 4-bit codes, low nibble = even element"),
            ("scales", "T", False, "[N, K/G]"),
            ("zero_points", "T_ZP", True, "[N, K/G] float (scales dtype) or uint8 [N, ceil(K/G/2)] packed; absent = 8"),
        ],
        "outputs": [("Y", "T", False, "[..., N]")],
        "type_constraints": [
            ("T", _FLOATS, "activations and scales"),
            ("T_UINT8", ["tensor(uint8)"], "packed codes"),
            ("T_ZP", ["tensor(uint8)", "tensor(float)", "tensor(float16)"], "zero points"),
        ],
        "attributes": [
            ("K", "int", None, "input features"),
            ("N", "int", None, "output features"),
            ("group_size", "int", None, "G, a power of two >= 16 dividing K"),
            ("bits", "int", 4, "code width: 4, or 8 for an 8-bit LM head (codes [N, K/G, G])"),
            ("plugin_namespace", "string", "", "TensorRT plugin namespace (no semantic effect)"),
            ("plugin_version", "string", "1", "TensorRT plugin version (no semantic effect)"),
        ],
    },
}


def op_schema_canonical_text() -> str:
    """Canonical JSON text of the domain, version and both op signatures (inputs, outputs,
    type constraints, attributes with kinds and defaults). Docs and descriptions are left out:
    rewording a docstring does not change the ABI."""
    ops = {}
    for name, spec in sorted(OP_SPECS.items()):
        ops[name] = {
            "inputs": [[n, t, opt] for n, t, opt, _ in spec["inputs"]],
            "outputs": [[n, t, opt] for n, t, opt, _ in spec["outputs"]],
            "type_constraints": [[n, sorted(types)] for n, types, _ in spec["type_constraints"]],
            "attributes": [[n, kind, default] for n, kind, default, _ in spec["attributes"]],
        }
    doc = {"domain": OP_DOMAIN, "version": OP_VERSION, "ops": ops}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def op_schema_abi_hash() -> str:
    """sha256 hex digest of :func:`op_schema_canonical_text`, recorded in the manifest."""
    return hashlib.sha256(op_schema_canonical_text().encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# onnx registration (onnx imported lazily: the runtime never needs it)
# --------------------------------------------------------------------------------------------


def _attr_int(ctx: Any, name: str) -> int | None:
    a = ctx.get_attribute(name)
    return None if a is None else int(a.i)


def _dims(type_proto: Any) -> list[int | None] | None:
    """Static dims of a tensor type (None for unknown dims), or None when the rank is unknown."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]


def _check_dims(op: str, name: str, got: list[int | None] | None, expected: list[int | None]) -> None:
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


def _copy_type(ctx: Any, src_idx: int, dst_idx: int) -> None:
    import onnx

    t = ctx.get_input_type(src_idx)
    if t is None:
        return
    out = onnx.TypeProto()
    out.CopyFrom(t)
    ctx.set_output_type(dst_idx, out)


def _infer_paged_attention(ctx: Any) -> None:
    H = _attr_int(ctx, "num_heads")
    KVH = _attr_int(ctx, "num_kv_heads")
    D = _attr_int(ctx, "head_size")
    BS = _attr_int(ctx, "block_size")
    q = _dims(ctx.get_input_type(0))
    T = q[0] if q and len(q) == 2 else None
    hd = H * D if H and D else None
    kvd = KVH * D if KVH and D else None
    _check_dims("PagedAttention", "query", q, [None, hd])
    _check_dims("PagedAttention", "key", _dims(ctx.get_input_type(1)), [T, kvd])
    _check_dims("PagedAttention", "value", _dims(ctx.get_input_type(2)), [T, kvd])
    kc = _dims(ctx.get_input_type(3))
    _check_dims("PagedAttention", "key_cache", kc, [KVH, None, BS, D])
    _check_dims("PagedAttention", "value_cache", _dims(ctx.get_input_type(4)), kc or [KVH, None, BS, D])
    _check_dims("PagedAttention", "slot_mapping", _dims(ctx.get_input_type(5)), [T])
    _copy_type(ctx, 0, 0)
    _copy_type(ctx, 3, 1)
    _copy_type(ctx, 4, 2)


def _infer_int4_gemm(ctx: Any) -> None:
    import onnx

    K = _attr_int(ctx, "K")
    N = _attr_int(ctx, "N")
    G = _attr_int(ctx, "group_size")
    nb = K // G if K and G else None
    a_type = ctx.get_input_type(0)
    a = _dims(a_type)
    if a is not None:
        if not a:
            from onnx.shape_inference import InferenceError

            raise InferenceError("trtpipe::Int4Gemm: input A is a scalar, expected [..., K]")
        expected_a: list[int | None] = [None] * (len(a) - 1)  # leading dims free, last one K
        _check_dims("Int4Gemm", "A", a, expected_a + [K])
    _check_dims("Int4Gemm", "B", _dims(ctx.get_input_type(1)), [N, nb, G // 2 if G else None])
    _check_dims("Int4Gemm", "scales", _dims(ctx.get_input_type(2)), [N, nb])
    if ctx.get_num_inputs() > 3 and ctx.has_input(3):
        zp_type = ctx.get_input_type(3)
        if zp_type is not None and zp_type.tensor_type.elem_type == onnx.TensorProto.UINT8:
            _check_dims("Int4Gemm", "zero_points", _dims(zp_type), [N, (nb + 1) // 2 if nb else None])
        else:
            _check_dims("Int4Gemm", "zero_points", _dims(zp_type), [N, nb])
    if a_type is None:
        return
    out = onnx.TypeProto()
    out.CopyFrom(a_type)
    shape = out.tensor_type.shape if a_type.tensor_type.HasField("shape") else None
    if shape is not None and len(shape.dim):
        last = shape.dim[len(shape.dim) - 1]
        last.Clear()
        if N is not None:
            last.dim_value = N
    ctx.set_output_type(0, out)


_INFERENCE = {"PagedAttention": _infer_paged_attention, "Int4Gemm": _infer_int4_gemm}


def _build_schema(name: str, spec: dict[str, Any]) -> Any:
    import onnx
    from onnx.defs import OpSchema

    def param(n: str, t: str, optional: bool, desc: str) -> Any:
        option = OpSchema.FormalParameterOption.Optional if optional else OpSchema.FormalParameterOption.Single
        return OpSchema.FormalParameter(n, t, desc, param_option=option)

    kinds = {"int": OpSchema.AttrType.INT, "float": OpSchema.AttrType.FLOAT, "string": OpSchema.AttrType.STRING}
    attrs = []
    for n, kind, default, desc in spec["attributes"]:
        if default is None:
            attrs.append(OpSchema.Attribute(n, kinds[kind], desc, required=True))
        else:
            attrs.append(OpSchema.Attribute(n, onnx.helper.make_attribute(n, default), desc))
    schema = OpSchema(
        name,
        OP_DOMAIN,
        OP_VERSION,
        spec["doc"],
        inputs=[param(*p) for p in spec["inputs"]],
        outputs=[param(*p) for p in spec["outputs"]],
        type_constraints=[(n, list(types), desc) for n, types, desc in spec["type_constraints"]],
        attributes=attrs,
    )
    schema.set_type_and_shape_inference_function(_INFERENCE[name])
    return schema


def register_schemas() -> None:
    """Register the ``trtpipe`` op schemas with onnx (idempotent; needs onnx >= 1.16)."""
    import onnx.defs

    for name, spec in OP_SPECS.items():
        if not onnx.defs.has(name, OP_DOMAIN):
            onnx.defs.register_schema(_build_schema(name, spec))


def infer_trtpipe_shapes(model: Any, strict: bool = True) -> Any:
    """Register the schemas, then return ``onnx.shape_inference.infer_shapes(model,
    check_type=True, strict_mode=strict)``: value_info filled for trtpipe node outputs (and
    everything downstream); type-constraint violations and contradicting static dims raise."""
    import onnx.shape_inference

    register_schemas()
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=strict)
