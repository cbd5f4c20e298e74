"""Loaded model weights: float arrays or raw GGUF quantized blocks, under Hugging Face names.

Both loaders (GGUF and Hugging Face folders) produce a :class:`LoadedModel`: a
:class:`~trtpipe.runtime.artifact.model_config.ModelConfig` plus a dict of :class:`WeightTensor` keyed by
Hugging Face Llama parameter names (``model.layers.3.self_attn.q_proj.weight``...). Quantized GGUF
tensors keep their raw blocks so INT4 recipes can repack Q4_0/Q4_1 exactly instead of
re-quantizing; :meth:`WeightTensor.to_float` dequantizes on demand with the ``gguf`` package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtpipe.runtime.artifact.model_config import ModelConfig


@dataclass(frozen=True)
class WeightTensor:
    """One parameter.

    ``shape`` is the logical (Hugging Face) shape, e.g. ``[out_features, in_features]`` for a
    linear weight. ``data`` is either a float32 array of that shape (``qtype`` "F32") or, for GGUF
    quantized types ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"), the raw
    block bytes ``uint8 [out_features, row_bytes]`` exactly as stored in the file (rows already
    permuted to Hugging Face order; ``plugins/core/gguf_blocks`` decodes them).
    """

    name: str
    shape: tuple[int, ...]
    qtype: str
    data: np.ndarray

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in ("F32", "F16", "BF16")

    def to_float(self) -> np.ndarray:
        """Dequantized float32 array of ``shape`` (gguf's own dequantization for GGML types)."""
        if not self.is_quantized:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out = dequantize(self.data, GGMLQuantizationType[self.qtype])
        return np.asarray(out, dtype=np.float32).reshape(self.shape)


@dataclass
class LoadedModel:
    """A model's facts, weights and tokenizer source, whatever file format it came from."""

    config: ModelConfig
    weights: dict[str, WeightTensor]
    source_path: Path
    source_kind: str  # "gguf" | "hf"
    tokenizer_json: str | None = None  # serialized tokenizers.Tokenizer
    load_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def float_weight(self, name: str) -> np.ndarray:
        """Float32 array of weight ``name`` (dequantized if needed). KeyError names the weight."""
        try:
            return self.weights[name].to_float()
        except KeyError:
            raise KeyError(f"weight {name!r} not found in {self.source_path}") from None

    def lm_head_name(self) -> str:
        """Name of the LM-head matrix (the token embedding when embeddings are tied)."""
        if self.config.tie_word_embeddings or "lm_head.weight" not in self.weights:
            return "model.embed_tokens.weight"
        return "lm_head.weight"
