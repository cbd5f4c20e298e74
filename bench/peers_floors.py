"""bench/peers.py, the physical floors: no engine on this host can be faster.

Computed from model facts by the estimate's roofline (:func:`trtpipe.pipeline.estimate.roofline`,
peak rates, batch 1 unless stated) for the artifact's recipe and model, at this host's measured
rates (:func:`trtpipe.pipeline.targets.measure_host`: a NumPy copy for bandwidth, a float32 matmul
for FLOP/s; recorded in the raw results so ``--from-json`` reproduces the report):

* TTFT at n prompt tokens: ``max(prefill FLOP / FLOP/s, bytes / bandwidth)`` (compute-bound);
* TPOT at n prompt tokens: one decode step at the mean context of the 64 generated tokens
  (n + 32): the decode weights and that context's KV read once, over the bandwidth;
* throughput of 8 x (128 + 64): the 8 prefills, then 64 batch-8 decode steps at context 160.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from peers_workload import CONCURRENT_PROMPT_TOKENS, NUM_CONCURRENT, NUM_OUTPUT_TOKENS, PROMPT_LENGTHS


@dataclass(frozen=True)
class Floors:
    """Physical floors of the benchmark's measurements (seconds; tokens/s)."""

    recipe: str
    bandwidth_bytes_per_s: float  # measured on this host (peak the floors assume)
    fp32_flops_per_s: float
    decode_weight_read_bytes: int  # weights one decode step reads
    ttft_s: dict[int, float]  # prompt tokens -> s
    tpot_s: dict[int, float]  # prompt tokens -> s (at the mean context of the output)
    tps: float  # output tokens/s of the 8-request run

    def describe(self) -> str:
        return (
            f"the estimate's roofline for {self.recipe} at this host's measured "
            f"{self.bandwidth_bytes_per_s / 1e9:.1f} GB/s and {self.fp32_flops_per_s / 1e9:.0f} GFLOP/s fp32 "
            f"(a decode step reads {self.decode_weight_read_bytes / 1e6:.1f} MB of weights plus the KV)"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Floors:
        return cls(
            d["recipe"],
            d["bandwidth_bytes_per_s"],
            d["fp32_flops_per_s"],
            d["decode_weight_read_bytes"],
            {int(k): v for k, v in d["ttft_s"].items()},
            {int(k): v for k, v in d["tpot_s"].items()},
            d["tps"],
        )


def floors_for(recipe, config, bandwidth_bytes_per_s: float, fp32_flops_per_s: float) -> Floors:
    """Floors of ``recipe`` (a :class:`~trtpipe.pipeline.recipe.Recipe`) with the model facts
    ``config`` on a cpu of the given peak rates."""
    from trtpipe.pipeline.estimate import roofline, windowed_config
    from trtpipe.pipeline.targets import HostMeasurement, cpu_target

    host = HostMeasurement(bandwidth_bytes_per_s, fp32_flops_per_s, 0, 0, 1)
    roof = roofline(recipe, windowed_config(recipe, config), cpu_target(host))
    ttft = {n: roof.ttft_s(n, peak=True)[0] for n in PROMPT_LENGTHS}
    tpot = {n: roof.tpot_s(n + NUM_OUTPUT_TOKENS // 2, 1, peak=True)[0] for n in PROMPT_LENGTHS}
    prefill = NUM_CONCURRENT * roof.ttft_s(CONCURRENT_PROMPT_TOKENS, peak=True)[0]
    step, _ = roof.tpot_s(CONCURRENT_PROMPT_TOKENS + NUM_OUTPUT_TOKENS // 2, NUM_CONCURRENT, peak=True)
    tps = NUM_CONCURRENT * NUM_OUTPUT_TOKENS / (prefill + NUM_OUTPUT_TOKENS * step)
    return Floors(
        recipe.name, bandwidth_bytes_per_s, fp32_flops_per_s, roof.decode_read.weight_read_bytes, ttft, tpot, tps
    )


def artifact_floors(artifact: Path, bandwidth_bytes_per_s: float, fp32_flops_per_s: float) -> Floors:
    """Floors of the artifact's recipe (a shipped recipe, by the manifest's name) and model facts
    (the manifest's). Raises TrtpipeError when the recipe cannot be found."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.runtime.manifest import load_manifest

    m = load_manifest(artifact, verify_hashes=False)
    recipe = load_recipe(resolve_recipe_path(m.recipe_name), check_files=False)
    return floors_for(recipe, m.model, bandwidth_bytes_per_s, fp32_flops_per_s)


def measured_floors(artifact: Path) -> Floors:
    """:func:`artifact_floors` at the rates measured now on this host (~1.5 s)."""
    from trtpipe.pipeline.targets import measure_host

    h = measure_host()
    return artifact_floors(artifact, h.bandwidth_bytes_per_s, h.fp32_flops_per_s)
