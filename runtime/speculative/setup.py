"""Building the speculator for a loaded runtime (:class:`~trtpipe.runtime.llm.LLM`, which passes
it to its scheduler): check the engine's capabilities, measure the verify cost, make the speculator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.speculative.config import SpeculativeConfig
from trtpipe.runtime.speculative.cost import measure
from trtpipe.runtime.speculative.speculator import NgramSpeculator

if TYPE_CHECKING:
    from trtpipe.runtime.artifact.manifest import Manifest
    from trtpipe.runtime.engines.base import Engine
    from trtpipe.runtime.kv.block_pool import BlockPool


def build_speculator(
    config: SpeculativeConfig | None,
    engine: Engine,
    manifest: Manifest,
    block_pool: BlockPool,
    block_size: int,
    *,
    fused: bool,
) -> tuple[NgramSpeculator | None, str]:
    """The speculator for ``config`` (None: off) over ``engine``, and one line for reports. On:
    measures the verify cost against a decode step on this engine
    (:func:`~trtpipe.runtime.speculative.cost.measure`, well under a second; dummy KV in blocks of
    ``block_pool`` given back after), which sizes every proposal
    (:mod:`trtpipe.runtime.speculative.sizing`); ``fused``: the runtime fuses mixed steps. Raises
    :class:`RequestError` (``field`` "speculative") for a config that is not a :class:`SpeculativeConfig`,
    or an engine without ``capabilities.verifies_all_positions`` (TensorRT plans; a native library
    built before speculative decoding)."""
    if config is None:
        return None, "speculative decoding: off"
    if not isinstance(config, SpeculativeConfig):
        raise RequestError(
            f"speculative = {config!r}: expected a SpeculativeConfig or None. Fix: pass SpeculativeConfig(method='ngram').",
            field="speculative",
        )
    caps = engine.capabilities
    if not caps.verifies_all_positions:
        raise RequestError(
            f"speculative decoding: the {caps.backend} engine of {manifest.root} cannot return logits at every "
            "position of a verify chunk (TensorRT plans size that output by sequences; a native library built "
            f"before speculative decoding lacks tp_forward_rows). Fix: `{manifest.rebuild_command}` for the native "
            "engine, or run without speculative decoding.",
            field="speculative",
        )
    cost = measure(engine, block_pool, block_size, config.max_k, fused=fused)
    line = f"{config.describe()}; measured cost of a verify of n tokens vs a decode step: {cost.ratios()}"
    return NgramSpeculator(config, cost), line


__all__ = ["build_speculator"]
