"""Bytes of weights one decode step reads, by GGUF type, as the file stores them: every linear of
every layer and the LM head (the tied embedding when there is no ``lm_head``). The embedding
gather (one row per token), norms and biases are left out: they are a rounding error next to the
GEMMs (gpt-fast's "achieved bandwidth" counts the same matrices).

    step_bytes_by_type([(qtype, shape), ...]) ──► GgufStepBytes  (also from GGUF metadata alone)
    decode_step_bytes(LoadedModel)            ──► GgufStepBytes  (the loaded weights)

Sizes: :func:`trtpipe.plugins.core.gguf_blocks.gguf_nbytes` (ggml-common.h block sizes). A loaded
model's float weights count 4 B each (the GGUF loader widens F16 / BF16 to F32).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trtpipe.pipeline.model.quantize import LINEAR_NAMES
from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.plugins.core.gguf_blocks import gguf_nbytes

__all__ = ["GgufStepBytes", "decode_step_bytes", "decode_step_weight_names", "step_bytes_by_type"]


@dataclass(frozen=True)
class GgufStepBytes:
    """``bytes_by_type``: (GGUF type, bytes read per decode step), largest first (ties by name)."""

    bytes_by_type: tuple[tuple[str, int], ...]

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.bytes_by_type)

    def summary(self) -> str:
        """One line for the build log / ``trtpipe estimate``, e.g. ``decode step reads 1.5 MiB of
        weights: Q6_K 0.9 MiB (60 %), Q8_0 0.6 MiB (40 %)``."""
        total = self.total_bytes
        parts = [f"{t} {b / 2**20:.1f} MiB ({100 * b / max(total, 1):.0f} %)" for t, b in self.bytes_by_type]
        return f"decode step reads {total / 2**20:.1f} MiB of weights: " + ", ".join(parts)


def step_bytes_by_type(tensors: Iterable[tuple[str, tuple[int, ...]]]) -> GgufStepBytes:
    """Sum the file bytes of ``(qtype, logical shape)`` pairs by type. Raises KeyError for a type
    without a size, ValueError for a row that is not whole blocks (:func:`gguf_nbytes`)."""
    by_type: dict[str, int] = {}
    for qtype, shape in tensors:
        by_type[qtype] = by_type.get(qtype, 0) + gguf_nbytes(qtype, tuple(shape))
    return GgufStepBytes(tuple(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))))


def decode_step_weight_names(model: LoadedModel) -> list[str]:
    """Hugging Face names of the weights a decode step reads: the 7 linears of every layer, then
    the LM head (``lm_head.weight`` or the tied ``model.embed_tokens.weight``)."""
    parts = [("self_attn" if n in LINEAR_NAMES[:4] else "mlp", n) for n in LINEAR_NAMES]
    names = [f"model.layers.{i}.{p}.{n}.weight" for i in range(model.config.num_layers) for p, n in parts]
    return [*names, model.lm_head_name()]


def decode_step_bytes(model: LoadedModel) -> GgufStepBytes:
    """Bytes per decode step by GGUF type of a loaded model (see the module docstring). Raises
    KeyError naming a weight the model lacks."""
    weights = model.weights
    missing = [n for n in decode_step_weight_names(model) if n not in weights]
    if missing:
        raise KeyError(f"weight {missing[0]!r} not found in {model.source_path}")
    return step_bytes_by_type((weights[n].qtype, weights[n].shape) for n in decode_step_weight_names(model))
