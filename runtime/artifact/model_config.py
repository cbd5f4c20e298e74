"""Architecture facts of a decoder-only model, independent of where they came from.

Built by the loaders (GGUF metadata or a Hugging Face ``config.json``), written into the artifact
manifest, and read back by the runtime (no torch needed). Field names follow Hugging Face's
``LlamaConfig`` where one exists.

A model family is a description, not a code path: Llama, Mistral, Qwen2/3 and Gemma 2/3 differ
only in the fields below the Llama ones (per-layer RoPE base and window, norm layout and weight
convention, QK-norm, MLP activation, embedding scale, attention scale, logit soft-capping). Every
new field defaults to the Llama behaviour, so a manifest written before they existed reads back
with the same meaning. One decoder layer, in the two norm layouts (``x`` the residual stream)::

    "pre" (Llama, Qwen):       h = x + attn(norm1(x));             out = h + mlp(norm2(h))
    "sandwich" (Gemma 2/3):    h = x + norm2(attn(norm1(x)));       out = h + norm4(mlp(norm3(h)))

with Hugging Face weight names norm1 = ``input_layernorm``, norm2 = ``post_attention_layernorm``,
norm3 = ``pre_feedforward_layernorm``, norm4 = ``post_feedforward_layernorm`` (so in the "pre"
layout ``post_attention_layernorm`` is the norm before the MLP, as in Llama).
"""

from __future__ import annotations

import dataclasses
import math
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


NORM_LAYOUTS = ("pre", "sandwich")
FAMILY_FIELDS = (
    "layer_rope_theta",
    "layer_rope_scaled",
    "norm_layout",
    "norm_weight_offset",
    "qk_norm",
    "activation",
    "embedding_scale",
    "attention_scale",
    "attn_logit_softcap",
    "final_logit_softcap",
)  # the fields a family description adds to the Llama ones (defaults: Llama)
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer facts.

    Per-layer lists (``layer_num_kv_heads``, ``layer_sliding_window``) have ``num_layers``
    entries (left empty, they are filled from the model-wide value); a sliding window of 0 means
    full attention (Hugging Face convention: a query at position p sees keys j with
    p - W < j <= p). ``layer_rope_theta`` / ``layer_rope_scaled`` have ``num_layers`` entries or
    none (every layer: ``rope_theta``, scaled); read them through :meth:`layer_rope`.

    Family fields (defaults = Llama):

    * ``layer_rope_theta``: RoPE base of each layer (Gemma 3: 10,000 on sliding layers, ``rope_theta``
      on global ones); default ``()``: ``rope_theta`` on every layer.
    * ``layer_rope_scaled``: whether ``rope_scaling`` applies on each layer (Gemma 3 scales its
      global layers only); default ``()``: every layer.
    * ``norm_layout``: ``"pre"`` or ``"sandwich"`` (see the module docstring).
    * ``norm_weight_offset``: every RMSNorm (layer norms, QK-norms, final norm) multiplies by
      ``norm_weight_offset + weight``: 1.0 for Hugging Face Gemma weights (``Gemma3RMSNorm``'s
      ``1 + w``), 0.0 for Llama and for GGUF Gemma files (llama.cpp's convert stores ``w + 1``).
      A fact of the stored weights, not of the family.
    * ``qk_norm``: RMSNorm over ``head_dim`` on each query and key head after the projection and
      before RoPE (weights ``self_attn.q_norm.weight`` / ``k_norm.weight`` ``[head_dim]``).
    * ``activation``: the gated MLP's ``act`` in ``down(act(gate(x)) * up(x))``: ``"silu"`` or
      ``"gelu_tanh"`` (GELU, tanh approximation).
    * ``embedding_scale``: token embeddings are multiplied by it (Gemma: ``sqrt(hidden_size)``,
      rounded to the embedding's dtype as Hugging Face does); 1.0 = none.
    * ``attention_scale``: the softmax scale on q.k; 0.0 = ``head_dim ** -0.5`` (Gemma:
      ``query_pre_attn_scalar ** -0.5``). Read it through :attr:`softmax_scale`.
    * ``attn_logit_softcap``: scores become ``c * tanh(scores / c)`` before the mask (Gemma 2);
      0.0 = off.
    * ``final_logit_softcap``: logits become ``c * tanh(logits / c)`` (Gemma 2, some Gemma 3);
      0.0 = off.
    """

    architecture: str  # "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"
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
    # -- family fields (defaults: Llama; see the class docstring) --
    layer_rope_theta: tuple[float, ...] = ()
    layer_rope_scaled: tuple[bool, ...] = ()
    norm_layout: str = "pre"
    norm_weight_offset: float = 0.0
    qk_norm: bool = False
    activation: str = "silu"
    embedding_scale: float = 1.0
    attention_scale: float = 0.0
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0

    def __post_init__(self) -> None:
        n = self.num_layers
        if not self.layer_num_kv_heads:
            object.__setattr__(self, "layer_num_kv_heads", (self.num_kv_heads,) * n)
        if not self.layer_sliding_window:
            object.__setattr__(self, "layer_sliding_window", (0,) * n)
        for name in ("layer_num_kv_heads", "layer_sliding_window"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries; expected num_layers = {n}")
        for name in ("layer_rope_theta", "layer_rope_scaled"):  # () = uniform (see layer_rope)
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries; expected 0 or num_layers = {n}")
        for name, value, allowed in (
            ("norm_layout", self.norm_layout, NORM_LAYOUTS),
            ("activation", self.activation, ACTIVATIONS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} = {value!r}; expected one of {allowed}")
        for name in ("attention_scale", "attn_logit_softcap", "final_logit_softcap"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} = {getattr(self, name)!r}; expected >= 0 (0 = default/off)")

    def layer_rope(self, i: int) -> tuple[float, bool]:
        """(RoPE base, whether ``rope_scaling`` applies) of layer ``i``: ``layer_rope_theta[i]`` /
        ``layer_rope_scaled[i]``, or ``(rope_theta, True)`` where those tuples are empty."""
        theta = self.layer_rope_theta[i] if self.layer_rope_theta else float(self.rope_theta)
        return theta, (self.layer_rope_scaled[i] if self.layer_rope_scaled else True)

    def non_llama_features(self) -> tuple[str, ...]:
        """Names of the family fields that differ from the Llama defaults (empty for a Llama,
        Mistral or Qwen2 body; per-layer RoPE reported as ``layer_rope_theta``), for engines that
        run only part of the description to refuse the rest by name."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        names = [f for f in FAMILY_FIELDS if not f.startswith("layer_") and getattr(self, f) != defaults[f]]
        if any(self.layer_rope(i) != (float(self.rope_theta), True) for i in range(self.num_layers)):
            names.insert(0, "layer_rope_theta")
        return tuple(names)

    @property
    def softmax_scale(self) -> float:
        """The scale on q.k before the softmax: ``attention_scale``, or ``head_dim ** -0.5`` when 0."""
        return self.attention_scale or 1.0 / math.sqrt(self.head_dim)

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
        """Build from :meth:`to_dict` output (e.g. the artifact manifest). Keys a manifest written
        before a field existed lacks take the field's default (the Llama behaviour)."""
        d = dict(d)
        rs = d.get("rope_scaling")
        d["rope_scaling"] = RopeScaling(**rs) if rs else None
        for k in (
            "layer_num_kv_heads",
            "layer_sliding_window",
            "layer_rope_theta",
            "layer_rope_scaled",
            "eos_token_ids",
        ):
            if k in d and d[k] is not None:
                d[k] = tuple(d[k])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
