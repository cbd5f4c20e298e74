"""The model families trtpipe reads, each a description the loaders turn into
:class:`~trtpipe.runtime.artifact.model_config.ModelConfig` fields (no per-family code paths).

A :class:`Family` holds what neither a GGUF file nor a Hugging Face ``config.json`` always states:
defaults that transformers and llama.cpp hard-code per architecture. Sources, per family:

* llama / mistral / qwen2: HF ``modeling_llama.py`` / ``modeling_mistral.py`` / ``modeling_qwen2.py``.
* qwen3: HF ``modeling_qwen3.py`` (QK-norm on a Llama body, no bias).
* gemma2: HF ``configuration_gemma2.py`` (layer i slides when ``(i + 1) % 2``; soft-caps 50 / 30),
  llama.cpp ``llama-model.cpp`` ``LLM_ARCH_GEMMA2`` (``set_swa_pattern(2)``, window 4096 when the
  key is absent, soft-caps from ``gemma2.attn_logit_softcapping`` / ``final_logit_softcapping``).
* gemma3: HF ``configuration_gemma3.py`` (``sliding_window_pattern`` 6, local RoPE base 10,000,
  global 1,000,000), llama.cpp ``LLM_ARCH_GEMMA3`` (``set_swa_pattern(6)``,
  ``rope_freq_base_train_swa = 10000``, no attention soft-cap).

Gemma's query scale: HF ``query_pre_attn_scalar`` (config.json); llama.cpp (GGUF, no key) uses
``hidden / heads`` for the 27B models (Gemma 2: 46 layers, Gemma 3: 62) and ``head_dim``
otherwise: :func:`gguf_query_pre_attn_scalar`. Torch-free.

To add a family: a :class:`Family` entry here, its GGUF tensor names in ``gguf.py`` if they are
new, and a parity test against transformers (tests/pipeline/test_model_vs_transformers.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """Per-architecture defaults (see the module docstring for sources).

    ``window_pattern``: n > 0: layer i uses the sliding window when ``(i + 1) % n != 0`` (the
    others attend globally); 1: every layer slides (Mistral); 0: the loader's own rule (Qwen's
    ``max_window_layers``, or no window). ``local_rope_theta``: the RoPE base of sliding layers
    (0.0: the model's ``rope_theta``); RoPE scaling then applies to global layers only.
    ``gemma_norms``: Hugging Face weights are stored as ``w`` for a ``1 + w`` multiplier.
    """

    architecture: str  # ModelConfig.architecture and GGUF general.architecture
    hf_class: str  # config.json "architectures" entry
    norm_layout: str = "pre"
    qk_norm: bool = False
    activation: str = "silu"
    scale_embedding: bool = False  # embeddings times sqrt(hidden_size)
    gemma_norms: bool = False
    window_pattern: int = 0
    local_rope_theta: float = 0.0
    attn_logit_softcap: float = 0.0  # default when the file does not say
    final_logit_softcap: float = 0.0  # default when the file does not say
    default_window: int = 0  # GGUF: the window when the key is absent (llama.cpp's default)
    gguf_permuted_qk: bool = False  # Q/K rows in llama.cpp's permuted order (general.architecture "llama")
    gguf_softcap_keys: bool = False  # {arch}.attn_logit_softcapping / final_logit_softcapping


_GEMMA = dict(norm_layout="sandwich", activation="gelu_tanh", scale_embedding=True, gemma_norms=True)

FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("llama", "LlamaForCausalLM", gguf_permuted_qk=True),
        Family("mistral", "MistralForCausalLM", window_pattern=1),
        Family("qwen2", "Qwen2ForCausalLM"),
        Family("qwen3", "Qwen3ForCausalLM", qk_norm=True),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            window_pattern=2,
            attn_logit_softcap=50.0,
            final_logit_softcap=30.0,
            default_window=4096,
            gguf_softcap_keys=True,
            **_GEMMA,  # type: ignore[arg-type]
        ),
        Family(
            "gemma3",
            "Gemma3ForCausalLM",
            qk_norm=True,
            window_pattern=6,
            local_rope_theta=10000.0,
            gguf_softcap_keys=True,
            **_GEMMA,  # type: ignore[arg-type]
        ),
    )
}
BY_HF_CLASS: dict[str, Family] = {f.hf_class: f for f in FAMILIES.values()}


def unsupported_message(what: str, value: object, known: list[str]) -> str:
    """The refusal for an architecture no :class:`Family` describes: names the value, every
    supported family and how to ask for another."""
    return (
        f"{what} = {value!r} is not supported; supported: {', '.join(known)}. Fix: convert a model of "
        "one of these families, or open a trtpipe issue naming the architecture (and a small public "
        "checkpoint of it) to ask for another family."
    )


def sliding_layers(family: Family, num_layers: int) -> tuple[bool, ...]:
    """Which layers use the sliding window under ``family.window_pattern`` (all False for 0)."""
    n = family.window_pattern
    if n == 1:
        return (True,) * num_layers
    return tuple(n > 1 and (i + 1) % n != 0 for i in range(num_layers))


def gguf_query_pre_attn_scalar(family: Family, num_layers: int, hidden: int, heads: int, head_dim: int) -> float:
    """llama.cpp's Gemma query scale denominator (``f_attention_scale = 1/sqrt(this)``): ``hidden /
    heads`` (integer division) for the 27B models, ``head_dim`` otherwise; 0.0 (= head_dim) for
    non-Gemma families."""
    if not family.gemma_norms:
        return 0.0
    is_27b = num_layers == {"gemma2": 46, "gemma3": 62}.get(family.architecture)
    return float(hidden // heads if is_27b else head_dim)


def layer_rope_fields(sliding: tuple[bool, ...], theta: float, local_theta: float) -> dict:
    """``layer_rope_theta`` / ``layer_rope_scaled`` of :class:`ModelConfig` for a global base
    ``theta``: sliding layers take ``local_theta`` unscaled (Gemma 3); with no local base (0.0)
    or no sliding layer both stay empty (every layer: ``rope_theta``, scaled)."""
    if not local_theta or not any(sliding):
        return dict(layer_rope_theta=(), layer_rope_scaled=())
    return dict(
        layer_rope_theta=tuple(local_theta if s else theta for s in sliding),
        layer_rope_scaled=tuple(not s for s in sliding),
    )
