"""bench/peers.py, the physical floors: no engine on this host can be faster.

Computed from model facts by the estimate's roofline (:func:`trtpipe.pipeline.estimate.roofline`,
peak rates, batch 1 unless stated) for the artifact's recipe and model, at this host's measured
rates (``bench/host_peaks.py``: ONNX Runtime's read bandwidth, fp32 and int8 GEMM peaks; recorded
in the raw results so ``--from-json`` reproduces the report):

* TTFT at n prompt tokens: ``max(prefill FLOP / FLOP/s, bytes / bandwidth)`` (compute-bound), at
  the **int8** peak when the artifact's INT4 GEMMs quantize activations to int8 (the native CPU
  engine's kernels, or ``engine.ort_accuracy_level`` 4 in prefill), else at the fp32 peak;
* TPOT at n prompt tokens: one decode step at the mean context of the 64 generated tokens
  (n + 32): the decode weights and that context's KV read once, over the bandwidth; the native
  engine's weights are its ``native.bin`` (fp16 scales and minimums, the Q8_0 head), which it
  reads in place of the ONNX graphs' initializers;
* throughput of 8 x (128 + 64): the 8 prefills, then 64 batch-8 decode steps at context 160.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from host_peaks import HostPeaks, measure_peaks
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
    int8_ops_per_s: float = 0.0  # measured int8 GEMM peak (0: not measured; raw results before it)
    gemm_compute: str = "fp32"  # the dtype the artifact's GEMMs compute in: fp32 | int8

    def describe(self) -> str:
        int8 = f", {self.int8_ops_per_s / 1e9:.0f} GOP/s int8" if self.int8_ops_per_s else ""
        return (
            f"the estimate's roofline for {self.recipe} at this host's measured "
            f"{self.bandwidth_bytes_per_s / 1e9:.1f} GB/s and {self.fp32_flops_per_s / 1e9:.0f} GFLOP/s fp32{int8}; "
            f"GEMMs at the {self.gemm_compute} peak "
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
            d.get("int8_ops_per_s", 0.0),
            d.get("gemm_compute", "fp32"),
        )


def int8_activations(recipe) -> bool:
    """Whether the recipe's cpu prefill GEMMs (the compute-bound ones the floors use) run int8 dot
    products: INT4 prefill weights with ``engine.ort_accuracy_level`` 4 for prefill (MatMulNBits
    quantizes each activation block to int8)."""
    return recipe.precision.prefill == "int4" and recipe.engine.accuracy_level("prefill") == 4


def floors_for(
    recipe,
    config,
    bandwidth_bytes_per_s: float,
    fp32_flops_per_s: float,
    int8_ops_per_s: float = 0.0,
    native_weight_bytes: int | None = None,
) -> Floors:
    """Floors of ``recipe`` (a :class:`~trtpipe.pipeline.recipe.Recipe`) with the model facts
    ``config`` on a cpu of the given peak rates; the GEMMs compute at ``int8_ops_per_s`` when it
    is given and the native engine runs (``native_weight_bytes``: the bytes its decode step reads,
    ``native.bin``) or :func:`int8_activations` holds, else at ``fp32_flops_per_s``. With the
    native engine a batch-1 decode floor reads ``native_weight_bytes`` instead of the roofline's
    graph weights (the floor is bandwidth-bound: the difference in bytes over the bandwidth)."""
    from dataclasses import replace

    from trtpipe.pipeline.estimate import roofline, windowed_config
    from trtpipe.pipeline.targets import HostMeasurement, cpu_target

    host = HostMeasurement(bandwidth_bytes_per_s, fp32_flops_per_s, 0, 0, 1)
    target = cpu_target(host)
    roof = roofline(recipe, windowed_config(recipe, config), target)
    int8 = native_weight_bytes is not None or int8_activations(recipe)
    gemm_compute = "int8" if int8_ops_per_s and int8 else "fp32"
    if gemm_compute == "int8":
        peaks = tuple((d, int8_ops_per_s if d == "int8" else f) for d, f in target.peak_flops)
        roof = replace(
            roof, target=replace(target, peak_flops=peaks), prefill_compute_dtype="int8", decode_compute_dtype="int8"
        )
    ttft = {n: roof.ttft_s(n, peak=True)[0] for n in PROMPT_LENGTHS}
    tpot = {n: roof.tpot_s(n + NUM_OUTPUT_TOKENS // 2, 1, peak=True)[0] for n in PROMPT_LENGTHS}
    weight_bytes = roof.decode_read.weight_read_bytes
    if native_weight_bytes is not None:
        tpot = {n: t - (weight_bytes - native_weight_bytes) / bandwidth_bytes_per_s for n, t in tpot.items()}
        weight_bytes = native_weight_bytes
    prefill = NUM_CONCURRENT * roof.ttft_s(CONCURRENT_PROMPT_TOKENS, peak=True)[0]
    step, _ = roof.tpot_s(CONCURRENT_PROMPT_TOKENS + NUM_OUTPUT_TOKENS // 2, NUM_CONCURRENT, peak=True)
    tps = NUM_CONCURRENT * NUM_OUTPUT_TOKENS / (prefill + NUM_OUTPUT_TOKENS * step)
    return Floors(
        recipe.name,
        bandwidth_bytes_per_s,
        fp32_flops_per_s,
        weight_bytes,
        ttft,
        tpot,
        tps,
        int8_ops_per_s,
        gemm_compute,
    )


def artifact_floors(
    artifact: Path, bandwidth_bytes_per_s: float, fp32_flops_per_s: float, int8_ops_per_s: float = 0.0
) -> Floors:
    """Floors of the artifact's recipe (a shipped recipe, by the manifest's name) and model facts
    (the manifest's), for the native engine when the artifact has one (what its default engine
    runs). Raises TrtpipeError when the recipe cannot be found."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.runtime.artifact.manifest import load_manifest

    m = load_manifest(artifact, verify_hashes=False)
    recipe = load_recipe(resolve_recipe_path(m.recipe_name), check_files=False)
    native = getattr(m.options, "native", None)
    native_bytes = (artifact / native.weights_file).stat().st_size if native is not None else None
    return floors_for(recipe, m.model, bandwidth_bytes_per_s, fp32_flops_per_s, int8_ops_per_s, native_bytes)


def measured_floors(artifact: Path, threads: int = 2) -> tuple[Floors, HostPeaks]:
    """:func:`artifact_floors` at the peaks ``bench/host_peaks.py`` measures now (~5 s), and
    those peaks (the report prints them)."""
    p = measure_peaks(threads)
    return artifact_floors(artifact, p.read_bytes_per_s, p.fp32_flops_per_s, p.int8_ops_per_s), p
