"""Load stage: recipe -> the model's weights and facts, checked against the recipe.

:func:`load_model` reads the GGUF file or Hugging Face folder the recipe names;
:func:`prepare_model` checks the recipe against the model, applies the recipe's
``sliding_window`` override and plans the KV pool, giving every later stage one
:class:`PreparedModel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.pipeline.build.errors import BuildError
from trtpipe.pipeline.model_config_override import with_sliding_window
from trtpipe.pipeline.recipe import Recipe, check_recipe_against_model, plan_kv_num_blocks
from trtpipe.pipeline.weights import LoadedModel
from trtpipe.plugins.core.dtypes import DTYPES
from trtpipe.runtime.artifact.manifest import KVLayout
from trtpipe.runtime.artifact.model_config import ModelConfig


@dataclass(frozen=True)
class PreparedModel:
    """A loaded model with the recipe's overrides applied: what export, lowering and packaging read."""

    loaded: LoadedModel  # weights and tokenizer, as read
    config: ModelConfig  # loaded.config with the recipe's sliding_window (if any) on every layer
    sliding_window: int  # the one window every layer shares (0 = full attention)
    kv: KVLayout  # the paged KV pool the engines bind
    load_s: float  # seconds spent reading the model


def load_model(recipe: Recipe) -> LoadedModel:
    """Load the recipe's model (GGUF or Hugging Face folder). Raises :class:`BuildError` for a
    planning recipe (no ``model.source``)."""
    src = recipe.resolve_source()
    if src.kind == "gguf":
        from trtpipe.pipeline.gguf_loader import load_gguf

        return load_gguf(src.path)
    if src.kind == "hf":
        from trtpipe.pipeline.hf_loader import load_hf_folder

        return load_hf_folder(src.path)
    raise BuildError(
        f"recipe {recipe.name}: model.source is not set (a planning recipe); nothing to build. "
        "Fix: use `trtpipe estimate` for planning recipes, or set model.source."
    )


def prepare_model(recipe: Recipe, loaded: LoadedModel, load_s: float = 0.0) -> PreparedModel:
    """Check ``recipe`` against ``loaded`` and apply its overrides. Raises :class:`RecipeError`
    (recipe vs model) or :class:`BuildError` (layers with different windows: the KV manager
    handles one window per pool)."""
    config = loaded.config
    check_recipe_against_model(recipe, config)
    config = with_sliding_window(config, recipe.sliding_window)
    windows = set(config.layer_sliding_window)
    if len(windows) > 1:
        raise BuildError(
            f"model {config.name}: layers use different sliding windows {sorted(windows)}; "
            "the KV manager handles one window per pool. Fix: set sliding_window in the recipe."
        )
    window = next(iter(windows))
    kv = KVLayout(
        block_size=recipe.kv_cache.block_size,
        num_blocks=plan_kv_num_blocks(recipe, config),
        dtype=DTYPES[recipe.kv_dtype].numpy_name,
        layer_num_kv_heads=tuple(config.layer_num_kv_heads),
        head_dim=config.head_dim,
        sliding_window=window,
    )
    return PreparedModel(loaded, config, window, kv, load_s)
