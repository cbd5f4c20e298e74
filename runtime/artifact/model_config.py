"""Architecture facts of a decoder-only Llama-family model, independent of where they came from.

Built by the loaders (GGUF metadata or a Hugging Face ``config.json``), written into the artifact
manifest, and read back by the runtime (no torch needed). Field names follow Hugging Face's
``LlamaConfig`` where one exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trtpipe.plugins.core.kv_codec import kv_head_token_bytes


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, as in Hugging Face ``rope_scaling``.

    ``rope_type`` is ``"linear"`` (positions divided by ``factor``) or ``"llama3"`` (Llama 3.1
    wavelength-dependent scaling with ``low_freq_factor``, ``high_freq_factor`` and
    ``original_max_position_embeddings``). Unknown types are rejected by the loaders.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer facts.

    Per-layer lists (``layer_num_kv_heads``, ``layer_sliding_window``) have ``num_layers``
    entries; a sliding window of 0 means full attention (Hugging Face convention: a query at
    position p sees keys j with p - W < j <= p).
    """

    architecture: str  # "llama", "mistral", "qwen2"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    rope_scaling: RopeScaling | None = None
    layer_num_kv_heads: tuple[int, ...] = ()
    layer_sliding_window: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.layer_num_kv_heads:
            object.__setattr__(self, "layer_num_kv_heads", (self.num_kv_heads,) * self.num_layers)
        if not self.layer_sliding_window:
            object.__setattr__(self, "layer_sliding_window", (0,) * self.num_layers)
        if len(self.layer_num_kv_heads) != self.num_layers:
            raise ValueError("layer_num_kv_heads must have num_layers entries")
        if len(self.layer_sliding_window) != self.num_layers:
            raise ValueError("layer_sliding_window must have num_layers entries")

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """Bytes of K and V for one token over all layers: sum_l 2 * kv_heads_l * row_bytes, where
        row_bytes = head_dim * dtype bytes (+ 4 for an int8 pool's scale; plugins/core/kv_codec.py)."""
        row = kv_head_token_bytes(kv_dtype, self.head_dim)
        return sum(2 * h * row for h in self.layer_num_kv_heads)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists); inverse of :meth:`from_dict`."""
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from :meth:`to_dict` output (e.g. the artifact manifest)."""
        d = dict(d)
        rs = d.get("rope_scaling")
        d["rope_scaling"] = RopeScaling(**rs) if rs else None
        for k in ("layer_num_kv_heads", "layer_sliding_window", "eos_token_ids"):
            if k in d and d[k] is not None:
                d[k] = tuple(d[k])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
