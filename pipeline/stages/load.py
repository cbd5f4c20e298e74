"""Load stage: recipe -> the model's weights and facts, checked against the recipe.

:func:`load_model` reads the GGUF file or Hugging Face folder the recipe names;
:func:`prepare_model` checks the recipe against the model, applies the recipe's
``sliding_window`` override, plans the KV pool and prepares the linear weights of every weight
precision the recipe's phases use (GGUF blocks repacked into the ``trtpipe::Int4Gemm`` layout:
:func:`~trtpipe.pipeline.model.quantize.quantize_model`), giving every later stage one
:class:`PreparedModel`; the torch reference is built over those weights, never repacking them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.pipeline.model.quantize import ModelWeights, QuantSpec, quantize_model
from trtpipe.pipeline.model.weights import LoadedModel
from trtpipe.pipeline.recipe import Recipe, check_recipe_against_model, plan_kv_num_blocks
from trtpipe.pipeline.stages.errors import BuildError
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
    weights: dict[str, ModelWeights] = field(default_factory=dict)  # "int4" | "fp32" -> prepared
    int4: QuantSpec = QuantSpec("int4")  # the recipe's INT4 group size and symmetry

    def weights_at(self, precision: str) -> ModelWeights:
        """The prepared weights at ``precision`` ("int4" or "fp32"); fp32 ones are prepared on
        first use when no phase runs them (the golden recording's reference)."""
        if precision not in self.weights:
            q = self.int4 if precision == "int4" else QuantSpec("fp32")
            self.weights[precision] = quantize_model(self.loaded, q)
        return self.weights[precision]


def load_model(recipe: Recipe) -> LoadedModel:
    """Load the recipe's model (GGUF or Hugging Face folder). Raises :class:`BuildError` for a
    planning recipe (no ``model.source``)."""
    src = recipe.resolve_source()
    if src.kind == "gguf":
        from trtpipe.pipeline.model.gguf import load_gguf

        return load_gguf(src.path)
    if src.kind == "hf":
        from trtpipe.pipeline.model.hf import load_hf_folder

        return load_hf_folder(src.path)
    raise BuildError(
        f"recipe {recipe.name}: model.source is not set (a planning recipe); nothing to build. "
        "Fix: use `trtpipe estimate` for planning recipes, or set model.source."
    )


def prepare_model(recipe: Recipe, loaded: LoadedModel, load_s: float = 0.0) -> PreparedModel:
    """Check ``recipe`` against ``loaded`` and apply its overrides. Raises :class:`RecipeError`
    (recipe vs model).

    The KV pool's window (``KVLayout.sliding_window``: blocks wholly before it are released) is
    the layers' window when they share one; with different windows per layer (Gemma 2/3: sliding
    and global layers) it is 0: every layer keeps the whole sequence's blocks (correct for every
    layer; each layer still attends over its own window, from ``config.layer_sliding_window``).
    A pool per attention kind, whose sliding layers free what leaves the window, is not built yet."""
    config = loaded.config
    check_recipe_against_model(recipe, config)
    config = with_sliding_window(config, recipe.sliding_window)
    windows = set(config.layer_sliding_window)
    window = next(iter(windows)) if len(windows) == 1 else 0
    kv = KVLayout(
        block_size=recipe.kv_cache.block_size,
        num_blocks=plan_kv_num_blocks(recipe, config),
        dtype=DTYPES[recipe.kv_dtype].numpy_name,
        layer_num_kv_heads=tuple(config.layer_num_kv_heads),
        head_dim=config.head_dim,
        sliding_window=window,
    )
    int4 = QuantSpec("int4", recipe.precision.int4.group_size, recipe.precision.int4.symmetric)
    model = PreparedModel(loaded, config, window, kv, load_s, {}, int4)
    for phase in ("prefill", "decode"):  # fp16/bf16 phases export fp32 weights (cast when lowered)
        model.weights_at("int4" if getattr(recipe.precision, phase) == "int4" else "fp32")
    return model
