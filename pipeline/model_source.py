"""Moved to :mod:`trtpipe.pipeline.recipe.model_source` (the recipe package resolves its own
``model.source``; this name stays so existing imports keep working)."""

from trtpipe.pipeline.recipe.model_source import (SHIPPED_MODELS, ModelSource, ModelSourceKind,  # noqa: F401
                                                  ShippedModel, _package_dir, resolve_model_source)
