"""Load a Hugging Face model folder (config.json, *.safetensors, tokenizer.json).

Supports the families of :mod:`trtpipe.pipeline.model.families` (``LlamaForCausalLM``,
``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM``). Per-layer sliding windows: ``layer_types`` when config.json has it (what
transformers >= 4.53 attends by), else the family's rule (Mistral: every layer; Qwen: layers at or
above ``max_window_layers`` when ``use_sliding_window``; Gemma: ``sliding_window_pattern``).
Gemma 3's per-layer RoPE: ``rope_parameters["sliding_attention" | "full_attention"]``
(transformers 5) or ``rope_local_base_freq`` / ``rope_theta`` / ``rope_scaling`` (4.x, scaling on
global layers). ``rope_scaling`` of type ``linear`` or ``llama3`` is kept; any other type is an
error, never silently dropped. Gemma norm weights are stored as ``w`` for ``1 + w``
(``norm_weight_offset`` 1, HF ``Gemma3RMSNorm``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from trtpipe.pipeline.model.families import BY_HF_CLASS, Family, layer_rope_fields, sliding_layers, unsupported_message
from trtpipe.pipeline.model.gguf import ModelLoadError
from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.runtime.artifact.model_config import ModelConfig, RopeScaling

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _rope_scaling(cfg: dict, path: Path) -> RopeScaling | None:
    rs = cfg.get("rope_scaling") or None
    if rs is None:
        # transformers >= 5 folds rope settings into rope_parameters
        rp = cfg.get("rope_parameters") or {}
        if rp.get("rope_type", "default") != "default":
            rs = rp
    return _scaling_of(rs, path)


def _scaling_of(rs: dict | None, path: Path) -> RopeScaling | None:
    """A ``rope_scaling`` / ``rope_parameters`` dict as :class:`RopeScaling` (None for default)."""
    if not rs:
        return None
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype == "default":
        return None
    if rtype == "linear":
        return RopeScaling("linear", float(rs["factor"]))
    if rtype == "llama3":
        return RopeScaling(
            "llama3",
            float(rs["factor"]),
            float(rs.get("low_freq_factor", 1.0)),
            float(rs.get("high_freq_factor", 4.0)),
            int(rs.get("original_max_position_embeddings", 8192)),
        )
    raise ModelLoadError(
        f"{path / 'config.json'}: rope_scaling.rope_type = {rtype!r} is not supported; expected "
        "'linear' or 'llama3'. Fix: use a model with a supported RoPE scaling."
    )


def _token_ids(value) -> list[int]:
    """An ``eos_token_id`` entry (int, list of int, or None) as a list of ints."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _end_of_generation_ids(cfg: dict, path: Path) -> tuple[int, ...]:
    """The ids that end a generation for a Hugging Face folder: ``config.json``'s ``eos_token_id``,
    then those of ``generation_config.json`` (what transformers' ``generate()`` stops on, e.g.
    Llama 3.1 Instruct's ``[128001, 128008, 128009]``: end of text, of message, of turn), in that
    order, without repeats. The GGUF side's rule is the same (EOS, EOT, EOM:
    :func:`trtpipe.pipeline.model.tokenizer.end_of_generation_ids`).

    ``cfg``: the parsed ``config.json``; ``path``: the model folder. Raises :class:`ModelLoadError`
    naming the file when ``generation_config.json`` exists but is not valid JSON.
    """
    ids = _token_ids(cfg.get("eos_token_id"))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        try:
            ids += _token_ids(json.loads(gen_file.read_text()).get("eos_token_id"))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
            raise ModelLoadError(
                f"{gen_file}: eos_token_id could not be read ({e}); expected a JSON object whose "
                "eos_token_id is an int or a list of ints. Fix: re-save the folder with transformers."
            ) from e
    return tuple(dict.fromkeys(ids))


def _layer_rope(cfg: dict, fam: Family, path: Path, sliding: tuple[bool, ...]) -> dict:
    """``rope_theta``, ``rope_scaling``, ``layer_rope_theta`` and ``layer_rope_scaled``.

    One RoPE for every layer (Llama, Qwen, Gemma 2): ``rope_theta`` (or ``rope_parameters``'s) and
    ``rope_scaling``. Gemma 3 (``fam.local_rope_theta``): global layers take the full-attention
    base and scaling, sliding layers the local base unscaled (HF ``Gemma3RotaryEmbedding``).
    """
    rp = cfg.get("rope_parameters") or {}
    if fam.local_rope_theta and "full_attention" in rp:  # transformers 5: one dict per layer type
        full, local = rp["full_attention"] or {}, rp.get("sliding_attention") or {}
        if _scaling_of(local, path) is not None:
            raise ModelLoadError(
                f"{path / 'config.json'}: rope_parameters.sliding_attention = {local!r} scales the local "
                "RoPE; expected rope_type 'default' (trtpipe scales global layers only). Fix: use the "
                "model's published config."
            )
        theta, scaling = float(full.get("rope_theta", 1e6)), _scaling_of(full, path)
        local_theta = float(local.get("rope_theta", fam.local_rope_theta))
    elif fam.local_rope_theta:  # transformers 4.x
        theta, scaling = float(cfg.get("rope_theta", 1e6)), _rope_scaling(cfg, path)
        local_theta = float(cfg.get("rope_local_base_freq", fam.local_rope_theta))
    else:
        theta = float(cfg.get("rope_theta") or rp.get("rope_theta", 10000.0))
        scaling, local_theta = _rope_scaling(cfg, path), 0.0
    return dict(rope_theta=theta, rope_scaling=scaling, **layer_rope_fields(sliding, theta, local_theta))


def _sliding(cfg: dict, fam: Family, n: int, path: Path) -> tuple[bool, ...]:
    """Which layers slide: ``layer_types`` if given, else the family's rule (module docstring)."""
    types = cfg.get("layer_types")
    if types:
        if len(types) != n or not set(types) <= {"sliding_attention", "full_attention"}:
            raise ModelLoadError(
                f"{path / 'config.json'}: layer_types = {types!r}; expected {n} entries, each "
                "'sliding_attention' or 'full_attention'. Fix: re-save the config with transformers."
            )
        return tuple(t == "sliding_attention" for t in types)
    if fam.window_pattern > 1 and cfg.get("sliding_window_pattern"):
        fam = dataclasses.replace(fam, window_pattern=int(cfg["sliding_window_pattern"]))
    if fam.window_pattern:
        return sliding_layers(fam, n)
    if cfg.get("use_sliding_window"):  # Qwen: layers at or above max_window_layers
        return tuple(i >= int(cfg.get("max_window_layers", n)) for i in range(n))
    return (False,) * n


def _family_facts(cfg: dict, fam: Family, path: Path, n: int, hidden: int) -> dict:
    """The family fields of :class:`ModelConfig` from config.json and ``fam``'s defaults."""
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(
            f"{path / 'config.json'}: use_bidirectional_attention = true (an embedding model); expected "
            "a causal decoder. Fix: use the model's causal-LM checkpoint."
        )
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or fam.activation
    if act not in _ACTIVATIONS:
        raise ModelLoadError(
            f"{path / 'config.json'}: hidden activation {act!r} is not supported; expected one of "
            f"{sorted(_ACTIVATIONS)}. Fix: open a trtpipe issue naming the architecture and activation."
        )
    sliding = _sliding(cfg, fam, n, path)
    window = int(cfg.get("sliding_window") or 0)
    qpas = cfg.get("query_pre_attn_scalar") if fam.gemma_norms else None
    return dict(
        layer_sliding_window=tuple(window if s else 0 for s in sliding),
        **_layer_rope(cfg, fam, path, sliding),
        norm_layout=fam.norm_layout,
        norm_weight_offset=1.0 if fam.gemma_norms else 0.0,
        qk_norm=fam.qk_norm,
        activation=_ACTIVATIONS[act],
        embedding_scale=hidden**0.5 if fam.scale_embedding else 1.0,
        attention_scale=float(qpas) ** -0.5 if qpas else 0.0,
        # Gemma 3's attention ignores attn_logit_softcapping (HF modeling_gemma3.py, llama.cpp)
        attn_logit_softcap=float(cfg.get("attn_logit_softcapping") or 0.0) if fam.attn_logit_softcap else 0.0,
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
    )


def config_from_hf(cfg: dict, path: Path) -> ModelConfig:
    """ModelConfig from a Hugging Face ``config.json`` dict (``cfg``) of the folder ``path``; the
    end-of-generation ids also read ``path / "generation_config.json"`` (:func:`_end_of_generation_ids`).
    Raises :class:`ModelLoadError` for an unsupported architecture, activation, RoPE scaling type,
    malformed ``layer_types`` or a bidirectional (embedding) model."""
    archs = cfg.get("architectures") or []
    fam = next((BY_HF_CLASS[a] for a in archs if a in BY_HF_CLASS), None)
    if fam is None:
        raise ModelLoadError(
            f"{path / 'config.json'}: " + unsupported_message("architectures", archs, sorted(BY_HF_CLASS))
        )
    n = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return ModelConfig(
        architecture=fam.architecture,
        num_layers=n,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", fam.architecture == "qwen2")),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_end_of_generation_ids(cfg, path),
        name=path.name,
        **_family_facts(cfg, fam, path, n, hidden),
    )


def load_hf_folder(path: str | Path) -> LoadedModel:
    """Read config.json, every ``*.safetensors`` file and (if present) tokenizer.json.

    Raises :class:`ModelLoadError` when config.json or the weights are missing.
    """
    path = Path(path)
    t0 = time.perf_counter()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json. Fix: point model.source at a Hugging Face model folder.")
    cfg = json.loads(cfg_file.read_text())
    config = config_from_hf(cfg, path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors files. Fix: save the model with safe_serialization=True.")
    from safetensors.numpy import load_file

    weights: dict[str, WeightTensor] = {}
    for f in files:
        for name, arr in load_file(str(f)).items():
            arr = np.asarray(arr)
            if arr.dtype != np.float32:
                arr = arr.astype(np.float32)
            weights[name] = WeightTensor(name, tuple(arr.shape), "F32", arr)
    tok = path / "tokenizer.json"
    chat_template = None
    tcfg = path / "tokenizer_config.json"
    if tcfg.is_file():
        chat_template = json.loads(tcfg.read_text()).get("chat_template")
    if chat_template:
        config = dataclasses.replace(config, chat_template=chat_template)
    return LoadedModel(
        config=config,
        weights=weights,
        source_path=path,
        source_kind="hf",
        tokenizer_json=tok.read_text() if tok.is_file() else None,
        load_time_s=time.perf_counter() - t0,
    )
