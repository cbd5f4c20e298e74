"""Linear weights in the form the reference model multiplies by: float, or packed blockwise INT4
(and the 8-bit LM head), prepared before any torch module exists (gpt-fast quantizes outside the
model, too).

GGUF blocks are repacked exactly where their form allows it (Q4_0 and Q4_1 at group size 32 into
the ``trtpipe::Int4Gemm`` / MatMulNBits layout, Q8_0 into 8-bit codes), everything else is
quantized round-to-nearest (:func:`trtpipe.plugins.ops.int4_gemm.pack.quantize_rtn`) from the
exact float weights (``WeightTensor.to_float``: gguf's own dequantization of Q5_0, Q5_1, Q4_K,
Q5_K, Q6_K, Q8_0 linears; not exact to the file). Pure NumPy: no torch.

    LoadedModel ──quantize_model(QuantSpec)──► ModelWeights {name: FloatWeights | PackedWeights}
                                                   └─► ReferenceModel(loaded, weights)  (torch)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.plugins.core.dtypes import FLOAT_NAMES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.ops.int4_gemm import pack as int4_pack
from trtpipe.plugins.ops.int4_gemm.layout import unpack_zero_points_uint8

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class QuantSpec:
    """How linear weights are stored: ``precision`` "fp32" (or fp16/bf16: float), "int4" (group
    size, symmetric) or "int8" (GGUF Q8_0 only: the LM head)."""

    precision: str = "fp32"
    group_size: int = 32
    symmetric: bool = False


@dataclass(frozen=True)
class FloatWeights:
    """``W [N, K]`` float32 (and an optional bias ``[N]``)."""

    weight: np.ndarray
    bias: np.ndarray | None = None


@dataclass(frozen=True)
class PackedWeights:
    """Blockwise weights of ``trtpipe::Int4Gemm``: ``packed`` ``[N, K/G, G/2]`` uint8 (``bits`` 4)
    or ``[N, K/G, G]`` (``bits`` 8), ``scales`` ``[N, K/G]`` float32, ``zero_points`` ``[N, K/G]``
    float32 (one export signature; integers exactly), bias ``[N]`` or None."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    K: int
    N: int
    group_size: int
    bits: int = 4
    bias: np.ndarray | None = None


LinearWeights = FloatWeights | PackedWeights


@dataclass(frozen=True)
class ModelWeights:
    """Every linear of a model by its Hugging Face weight name, the LM head under ``lm_head``
    (None: tied to the float embedding table, which the model then reuses)."""

    linears: Mapping[str, LinearWeights]
    lm_head: LinearWeights | None
    quant: QuantSpec


def linear_weights(model: LoadedModel, name: str, quant: QuantSpec, bias_name: str | None = None) -> LinearWeights:
    """The weights of linear ``name``: float, INT4 (exact repack of GGUF Q4_0/Q4_1 at group size
    32, round-to-nearest otherwise) or 8-bit (GGUF Q8_0). Raises :class:`OpError` for a precision
    the linear cannot take."""
    w = model.weights[name]
    bias = model.float_weight(bias_name) if bias_name and bias_name in model.weights else None
    if quant.precision in FLOAT_NAMES:
        return FloatWeights(w.to_float(), bias)
    N, K = w.shape
    if quant.precision == "int8":  # 8-bit weights: GGUF Q8_0 repacked exactly (the LM head)
        if w.qtype != "Q8_0":
            raise OpError(
                f"int8 weights are only built from GGUF Q8_0 tensors; {name} is {w.qtype}. "
                "Fix: leave lm_head_quant unset (quantize_model then builds a float head for other types)."
            )
        codes, scales = int4_pack.repack_gguf_q8_0_as_uint8(w.data, N, K)
        return PackedWeights(codes, scales, np.full(scales.shape, 128.0, np.float32), K, N, 32, 8, bias)
    if quant.precision != "int4":
        raise OpError(f"precision {quant.precision!r} is not supported for linear {name}")
    if w.qtype == "Q4_0" and quant.group_size == 32:
        packed, scales, zp = int4_pack.repack_gguf_q4_0(w.data, N, K)
    elif w.qtype == "Q4_1" and quant.group_size == 32:
        packed, scales, zp = int4_pack.repack_gguf_q4_1(w.data, N, K)
    else:
        packed, scales, zp = int4_pack.quantize_rtn(w.to_float(), quant.group_size, quant.symmetric)
        if zp is None:
            zp = int4_pack.pack_zero_points_uint8(np.full((N, K // quant.group_size), 8, np.uint8))
    zp = np.ascontiguousarray(zp)
    if zp.dtype == np.uint8:  # packed 4-bit -> float (one export signature; exact for integers)
        zp = unpack_zero_points_uint8(zp, N, K // quant.group_size)
    return PackedWeights(packed, np.asarray(scales, np.float32), zp.astype(np.float32), K, N, quant.group_size, 4, bias)


def quantize_model(
    model: LoadedModel, quant: QuantSpec = QuantSpec(), lm_head_quant: QuantSpec | None = None
) -> ModelWeights:
    """Every linear of ``model`` at ``quant``; the LM head at ``lm_head_quant``, else 8-bit when
    the linears are INT4 and the GGUF head is Q8_0 (exact, 4x smaller than fp32: decode reads
    the head every token), else float (None when it is the tied embedding table)."""
    c = model.config
    linears: dict[str, LinearWeights] = {}
    for i in range(c.num_layers):
        for part, names in (("self_attn", LINEAR_NAMES[:4]), ("mlp", LINEAR_NAMES[4:])):
            for n in names:
                p = f"model.layers.{i}.{part}.{n}"
                bias = f"{p}.bias" if part == "self_attn" and n != "o_proj" and c.attention_bias else None
                linears[f"{p}.weight"] = linear_weights(model, f"{p}.weight", quant, bias)
    head_name = model.lm_head_name()
    head = model.weights[head_name]
    if lm_head_quant is None and quant.precision == "int4" and head.qtype == "Q8_0":
        lm_head_quant = QuantSpec("int8", 32)
    lm_q = lm_head_quant or QuantSpec("fp32")
    tied = lm_q.precision == "fp32" and head_name == "model.embed_tokens.weight"
    return ModelWeights(linears, None if tied else linear_weights(model, head_name, lm_q), quant)


__all__ = [
    "FloatWeights",
    "LinearWeights",
    "ModelWeights",
    "PackedWeights",
    "QuantSpec",
    "linear_weights",
    "quantize_model",
]
