"""The seam between the runtime and an engine: what every engine implements (:class:`Engine`) and
what it declares it can do (:class:`EngineCapabilities`), so the runtime asks one record instead of
probing attributes, and mypy checks a new engine against the same contract.

    LLM / StepRunner / step-cost calibration / speculative setup
        │  engine.capabilities            -> EngineCapabilities (frozen; read once at load)
        │  engine.prefill(PrefillBatch)   -> logits [L, V] float32
        │  engine.decode(DecodeBatch)     -> logits [S, V] float32
        │  engine.copy_blocks([(src, dst)])  copy-on-write of forked KV blocks, before a step
        │  engine.last_step_s             wall seconds of the last prefill/decode call
        ▼
    NativeEngine (host CPU kernels) | OrtEngine (ONNX Runtime) | TrtEngine (TensorRT)

``L`` rows: the last token of each row of the batch, or the rows of ``batch.logit_indices``
(speculative verify, prompt logprobs) where ``verifies_all_positions``. Engines raise
:class:`~trtpipe.runtime.errors.ArtifactError` (or ``CudaError``) when a call fails; the step
runner finishes that step's requests with the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, declared by the engine (never probed).

    ``backend``: "native" | "ort" | "trt" (reports, the step-cost file's ``engine`` key).
    ``fuses_mixed_steps``: one ``prefill`` call takes a step's prompt chunks *and* its decodes as
    1-token rows (the runtime then makes one call per mixed step).
    ``copies_blocks``: :meth:`Engine.copy_blocks` copies KV blocks (n > 1 choices fork the prompt
    KV, copy-on-write of the partial last block); False: it refuses copies, and the choices share
    only full blocks through the prefix cache.
    ``verifies_all_positions``: ``prefill`` returns logits at every row of ``batch.logit_indices``
    (speculative verify chunks); False: speculative decoding is refused.
    ``kv_dtypes``: the KV pool dtypes the engine reads, recipe spelling
    (:data:`trtpipe.plugins.core.kv_codec.KV_DTYPES`: "fp32", "fp16", "bf16", "int8").
    """

    backend: str
    fuses_mixed_steps: bool
    copies_blocks: bool
    verifies_all_positions: bool
    kv_dtypes: tuple[str, ...]


class Engine(Protocol):
    """What the runtime calls on an engine (module docstring). Implemented by
    :class:`~trtpipe.runtime.engines.native.NativeEngine`,
    :class:`~trtpipe.runtime.engines.ort.OrtEngine` and :class:`~trtpipe.runtime.engines.trt.TrtEngine`;
    test doubles implement it too."""

    @property
    def capabilities(self) -> EngineCapabilities: ...

    @property
    def last_step_s(self) -> float: ...

    def prefill(self, batch: PrefillBatch) -> np.ndarray:
        """Logits ``[L, V]`` float32 of the batch's last-token rows (or ``batch.logit_indices``)."""
        ...

    def decode(self, batch: DecodeBatch) -> np.ndarray:
        """Logits ``[S, V]`` float32, one row per sequence of the batch."""
        ...

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy every layer's K and V block ``src`` into ``dst`` for each ``(src, dst)`` pair, before
        the step that writes ``dst``. An engine with ``copies_blocks`` False raises for a non-empty list."""
        ...


__all__ = ["Engine", "EngineCapabilities"]
