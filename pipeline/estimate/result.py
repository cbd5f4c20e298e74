"""The estimate of a recipe on a target: small frozen records composed into one :class:`Estimate`.

``Estimate`` holds the records of each concern (weights, KV, activations, the fit, latencies)
and keeps the flat names of the earlier single record as read-only properties, so callers and
``trtpipe estimate --json`` (one flat document, the same keys as before) are unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any

from trtpipe.pipeline.estimate.kv import KVEstimate
from trtpipe.pipeline.estimate.latency import LatencyRow
from trtpipe.pipeline.estimate.memory import Activations, MemoryFit, WeightsEstimate
from trtpipe.pipeline.estimate.notices import EstimateWarning
from trtpipe.pipeline.targets import TargetSpec

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass(frozen=True)
class Estimate:
    """Memory and latency of a recipe on a target (bytes exact, times in ms)."""

    recipe_name: str
    model_name: str
    target: TargetSpec
    weights: WeightsEstimate
    kv: KVEstimate
    activations: Activations
    memory: MemoryFit
    latencies: tuple[LatencyRow, ...]
    warnings: tuple[EstimateWarning, ...]
    notes: tuple[str, ...]
    build_host_bytes: int = 0  # host memory a build of the recipe needs (memory.build_host_bytes)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if any(w.fails for w in self.warnings) else EXIT_OK

    # -- the flat names of the single record this one replaced ---------------------------------
    layout = property(attrgetter("weights.layout"))
    prefill = property(attrgetter("weights.prefill"))
    decode = property(attrgetter("weights.decode"))
    engine_weight_bytes = property(attrgetter("weights.engine_bytes"))
    engine_weight_bytes_split = property(attrgetter("weights.split_bytes"))
    engine_weight_bytes_dual_profile = property(attrgetter("weights.dual_profile_bytes"))
    kv_dtype = property(attrgetter("kv.dtype"))
    kv_bytes_per_token = property(attrgetter("kv.bytes_per_token"))
    kv_bytes_per_token_layers = property(attrgetter("kv.bytes_per_token_layers"))
    kv_bytes_per_sequence = property(attrgetter("kv.bytes_per_sequence"))
    kv_block_bytes = property(attrgetter("kv.block_bytes"))
    kv_blocks_per_sequence = property(attrgetter("kv.blocks_per_sequence"))
    kv_pool_num_blocks = property(attrgetter("kv.pool_num_blocks"))
    kv_pool_bytes = property(attrgetter("kv.pool_bytes"))
    kv_pool_max_sequences = property(attrgetter("kv.pool_max_sequences"))
    prefill_activation_bytes = property(attrgetter("activations.prefill_bytes"))
    attention_scores_bytes = property(attrgetter("activations.scores_bytes"))
    decode_activation_bytes = property(attrgetter("activations.decode_bytes"))
    activation_bytes = property(attrgetter("activations.total_bytes"))
    engine_bytes = property(attrgetter("memory.engine_bytes"))
    engine_bytes_split = property(attrgetter("memory.engine_bytes_split"))
    engine_bytes_dual_profile = property(attrgetter("memory.engine_bytes_dual_profile"))
    usable_memory_bytes = property(attrgetter("memory.usable_memory_bytes"))
    fits = property(attrgetter("memory.fits"))
    max_sequences = property(attrgetter("memory.max_sequences"))

    def to_dict(self) -> dict[str, Any]:
        """The ``trtpipe estimate --json`` document: one flat dict (bytes, ms), the target's row,
        each latency row with its predicted/measured ratio, and the exit code."""
        return {
            "recipe_name": self.recipe_name,
            "model_name": self.model_name,
            **self.weights.to_dict(),
            **self.kv.to_dict(),
            **self.activations.to_dict(),
            **self.memory.to_dict(),
            "warnings": [asdict(w) for w in self.warnings],
            "notes": list(self.notes),
            "build_host_bytes": self.build_host_bytes,
            "target": self.target.to_dict(),
            "latencies": [{**asdict(r), "ratio": r.ratio} for r in self.latencies],
            "exit_code": self.exit_code,
        }
