"""The recipe's overrides of a model's facts, applied in one place.

Today one override exists: ``sliding_window`` (recipe key; see ``pipeline/recipe/schema.py``): None keeps
the model's own per-layer windows, 0 turns windowing off on every layer, n > 0 gives every layer a
window of n tokens (Hugging Face convention: a query at position p sees keys j with
p - n < j <= p). The build, the golden key, the estimate and the reference model all call
:func:`with_sliding_window`, so they agree on the windows an artifact uses. Torch-free.
"""

from __future__ import annotations

import dataclasses

from trtpipe.runtime.artifact.model_config import ModelConfig


def with_sliding_window(config: ModelConfig, sliding_window: int | None) -> ModelConfig:
    """``config`` with the recipe's ``sliding_window`` applied to every layer.

    Args:
        config: the model's facts as loaded (``layer_sliding_window`` has ``num_layers`` entries).
        sliding_window: tokens; None keeps ``config`` as is (the same object), 0 = full attention.

    Returns:
        A new frozen :class:`ModelConfig` whose ``layer_sliding_window`` is
        ``(sliding_window,) * num_layers``; every other field is unchanged.

    Raises:
        ValueError: ``sliding_window`` is negative or not an integer (the recipe validates it
        first; this guards other callers).
    """
    if sliding_window is None:
        return config
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValueError(
            f"sliding_window = {sliding_window!r}; expected None (keep the model's windows), 0 (off) "
            "or a positive number of tokens"
        )
    return dataclasses.replace(config, layer_sliding_window=(sliding_window,) * config.num_layers)
