"""THE description of ``trtpipe::Int4Gemm`` (weight-only INT4, blockwise along K, the
``com.microsoft::MatMulNBits`` packing; bits=8 for an LM head): inputs, outputs, type
constraints, attributes and the TensorRT plugin it lowers to. Every backend's parameter list is
built from :data:`INT4_GEMM` (:mod:`trtpipe.plugins.ops.spec`). Python has always spelled the
inputs ``A`` / ``B`` as ``a`` / ``b_packed``.
"""

from __future__ import annotations

from trtpipe.plugins.ops.spec import FLOAT_TENSORS, TRT_PARSER_FIELDS, Attribute, OpSpec, PluginSpec, Tensor
from trtpipe.plugins.ops.spec import TypeConstraint as C

__all__ = ["INT4_GEMM"]

_ATTRIBUTES = (
    Attribute("K", "int", None, "input features"),
    Attribute("N", "int", None, "output features"),
    Attribute("group_size", "int", None, "G, a power of two >= 16 dividing K"),
    Attribute("bits", "int", 4, "code width: 4, or 8 for an 8-bit LM head (codes [N, K/G, G])"),
)

INT4_GEMM = OpSpec(
    name="Int4Gemm",
    torch_name="int4_gemm",
    doc=(
        "Y[..., N] = A[..., K] @ W^T with W[N, K] = (q - zp) * scale blockwise along K "
        "(com.microsoft::MatMulNBits packing). Reference: trtpipe.plugins.ops.int4_gemm.reference.int4_gemm."
    ),
    inputs=(
        Tensor("A", "T", "[..., K]", arg="a"),
        Tensor("B", "T_UINT8", "[N, K/G, G/2] packed 4-bit codes, low nibble = even element", arg="b_packed"),
        Tensor("scales", "T", "[N, K/G]"),
        Tensor(
            "zero_points",
            "T_ZP",
            "[N, K/G] float (scales dtype) or uint8 [N, ceil(K/G/2)] packed; absent = 8",
            optional=True,
        ),
    ),
    outputs=(Tensor("Y", "T", "[..., N]"),),
    type_constraints=(
        C("T", FLOAT_TENSORS, "activations and scales"),
        C("T_UINT8", ("tensor(uint8)",), "packed codes"),
        C("T_ZP", ("tensor(uint8)", "tensor(float)", "tensor(float16)"), "zero points"),
    ),
    attributes=(*_ATTRIBUTES, *TRT_PARSER_FIELDS),
    plugins=(
        # zero points always float (the lowering unpacks uint8 ones, fills absent ones with 8): one signature
        PluginSpec(
            "Int4Gemm", inputs=("a", "b_packed", "scales", "zero_points"), outputs=("Y",), attributes=_ATTRIBUTES
        ),
    ),
)
