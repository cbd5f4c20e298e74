"""The torch reference decoder (one program over the model description): :mod:`.model` (the
model, its dense and paged forwards, :func:`build_reference_model`), :mod:`.layers` (norms,
attention, MLP, the decoder layer), :mod:`.linears` (float and packed INT4 linears)."""

from trtpipe.pipeline.model.reference.layers import MLP, Attention, DecoderLayer, RMSNorm, apply_rope
from trtpipe.pipeline.model.reference.linears import FloatLinear, Int4Linear, make_linear
from trtpipe.pipeline.model.reference.model import LlamaReference, ReferenceModel, build_reference_model, paged_refusal

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "FloatLinear",
    "Int4Linear",
    "LlamaReference",
    "RMSNorm",
    "ReferenceModel",
    "apply_rope",
    "build_reference_model",
    "make_linear",
    "paged_refusal",
]
