"""ONNX shape inference of ``trtpipe::Int4Gemm`` (docs/contracts.md): ``Y`` has A's type and
shape ``A.shape[:-1] + [N]``. Statically known dims that contradict the attributes (A's last dim
!= K, B != ``[N, K/G, G/2]``, scales != ``[N, K/G]``, zero points of neither form) raise
``onnx.shape_inference.InferenceError``. onnx is imported lazily.
"""

from __future__ import annotations

from typing import Any

from trtpipe.plugins.ops.onnx_schema import attr_int, check_dims, dims

__all__ = ["infer_int4_gemm"]


def infer_int4_gemm(ctx: Any) -> None:
    import onnx

    K = attr_int(ctx, "K")
    N = attr_int(ctx, "N")
    G = attr_int(ctx, "group_size")
    nb = K // G if K and G else None
    a_type = ctx.get_input_type(0)
    a = dims(a_type)
    if a is not None:
        if not a:
            from onnx.shape_inference import InferenceError

            raise InferenceError("trtpipe::Int4Gemm: input A is a scalar, expected [..., K]")
        expected_a: list[int | None] = [None] * (len(a) - 1)  # leading dims free, last one K
        check_dims("Int4Gemm", "A", a, expected_a + [K])
    check_dims("Int4Gemm", "B", dims(ctx.get_input_type(1)), [N, nb, G // 2 if G else None])
    check_dims("Int4Gemm", "scales", dims(ctx.get_input_type(2)), [N, nb])
    if ctx.get_num_inputs() > 3 and ctx.has_input(3):
        zp_type = ctx.get_input_type(3)
        if zp_type is not None and zp_type.tensor_type.elem_type == onnx.TensorProto.UINT8:
            check_dims("Int4Gemm", "zero_points", dims(zp_type), [N, (nb + 1) // 2 if nb else None])
        else:
            check_dims("Int4Gemm", "zero_points", dims(zp_type), [N, nb])
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
