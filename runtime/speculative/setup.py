"""Turning speculative decoding on for a loaded runtime (:class:`~trtpipe.runtime.llm.LLM`):
check the engine, measure the verify cost, hand the scheduler its speculator."""

from __future__ import annotations

from typing import Any

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.speculative.config import SpecConfig
from trtpipe.runtime.speculative.cost import measure
from trtpipe.runtime.speculative.speculator import NgramSpeculator


def enable_speculative(llm: Any, config: SpecConfig | None) -> str:
    """Speculative decoding on (``config``) or off (None) for ``llm``, between steps; returns one
    line for reports. On: measures the verify cost against a decode step on this engine
    (:func:`~trtpipe.runtime.speculative.cost.measure`, well under a second), which sizes every proposal
    (:mod:`trtpipe.runtime.speculative.sizing`). Raises :class:`RequestError` (``field`` "speculative")
    for a config that is not a :class:`SpecConfig`, or an engine that cannot return logits at
    every position of a chunk (TensorRT plans; a native library built before speculative decoding)."""
    if config is None:
        llm.scheduler.speculator = None
        return "speculative decoding: off"
    if not isinstance(config, SpecConfig):
        raise RequestError(
            f"speculative = {config!r}: expected a SpecConfig or None. Fix: pass SpecConfig(method='ngram').",
            field="speculative",
        )
    engine, manifest = llm.engine, llm.manifest
    if not getattr(engine, "verifies_all_positions", False):
        raise RequestError(
            f"speculative decoding: the {engine.backend} engine of {manifest.root} cannot return logits at every "
            "position of a verify chunk (TensorRT plans size that output by sequences; a native library built "
            f"before speculative decoding lacks tp_forward_rows). Fix: `{manifest.rebuild_command}` for the native "
            "engine, or run without speculative decoding.",
            field="speculative",
        )
    cost = measure(engine, llm.block_pool, llm.kv_manager.block_size, config.max_k, fused=llm.fuse_mixed_steps)
    llm.scheduler.speculator = NgramSpeculator(config, cost)
    return f"{config.describe()}; measured cost of a verify of n tokens vs a decode step: {cost.ratios()}"


__all__ = ["enable_speculative"]
