"""Load a Hugging Face model folder (config.json, *.safetensors, tokenizer.json).

Supports ``LlamaForCausalLM``, ``MistralForCausalLM`` and ``Qwen2ForCausalLM`` configs; per-layer
sliding windows follow each architecture's rule (Mistral: every layer; Qwen2: layers at or above
``max_window_layers`` when ``use_sliding_window``). ``rope_scaling`` of type ``linear`` or
``llama3`` is kept; any other type is an error, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from trtpipe.pipeline.model.gguf import ModelLoadError
from trtpipe.pipeline.model.weights import LoadedModel, WeightTensor
from trtpipe.runtime.artifact.model_config import ModelConfig, RopeScaling

_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


def _rope_scaling(cfg: dict, path: Path) -> RopeScaling | None:
    rs = cfg.get("rope_scaling") or None
    if rs is None:
        # transformers >= 5 folds rope settings into rope_parameters
        rp = cfg.get("rope_parameters") or {}
        if rp.get("rope_type", "default") != "default":
            rs = rp
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


def config_from_hf(cfg: dict, path: Path) -> ModelConfig:
    """ModelConfig from a Hugging Face ``config.json`` dict (``cfg``) of the folder ``path``; the
    end-of-generation ids also read ``path / "generation_config.json"`` (:func:`_end_of_generation_ids`).
    Raises :class:`ModelLoadError` for an unsupported architecture or RoPE scaling type."""
    archs = cfg.get("architectures") or []
    arch = next((_ARCHS[a] for a in archs if a in _ARCHS), None)
    if arch is None:
        raise ModelLoadError(
            f"{path / 'config.json'}: architectures = {archs!r} is not supported; expected one of {sorted(_ARCHS)}."
        )
    n = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    window = cfg.get("sliding_window") or 0
    if arch == "mistral":
        windows = (int(window),) * n
    elif arch == "qwen2" and cfg.get("use_sliding_window") and window:
        mwl = int(cfg.get("max_window_layers", n))
        windows = tuple(int(window) if i >= mwl else 0 for i in range(n))
    else:
        windows = (0,) * n
    rope_theta = cfg.get("rope_theta")
    if rope_theta is None:
        rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        architecture=arch,
        num_layers=n,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        rope_scaling=_rope_scaling(cfg, path),
        layer_sliding_window=windows,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_end_of_generation_ids(cfg, path),
        name=path.name,
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
