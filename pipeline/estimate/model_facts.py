"""The model facts of a recipe without loading weights: inline architecture, GGUF metadata, or a
Hugging Face ``config.json``."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from trtpipe.pipeline.recipe import Recipe
from trtpipe.runtime.artifact.model_config import ModelConfig


@lru_cache(maxsize=8)
def _gguf_config(path: str, mtime_ns: int, size: int) -> ModelConfig:
    # Keyed by mtime and size so an edited file is read again. GGUFReader parses the metadata
    # (most of its ~2-6 s is the tokenizer arrays) and memory-maps the tensors without reading
    # or dequantizing them.
    from gguf import GGUFReader

    from trtpipe.pipeline.model.gguf import ModelLoadError, config_from_gguf

    try:
        reader = GGUFReader(path)
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e
    return config_from_gguf(reader, Path(path))


def model_config_for(recipe: Recipe) -> ModelConfig:
    """The model facts of ``recipe`` without loading weights: inline ``model.architecture``,
    GGUF metadata, or a Hugging Face ``config.json``. Raises RecipeError / ModelLoadError."""
    if recipe.model.architecture is not None:
        return recipe.model.architecture.to_model_config()
    src = recipe.resolve_source()
    assert src.path is not None
    if src.kind == "gguf":
        st = src.path.stat()
        return _gguf_config(str(src.path), st.st_mtime_ns, st.st_size)
    from trtpipe.pipeline.model.hf import config_from_hf

    cfg = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
    return config_from_hf(cfg, src.path)
