"""The target table, the one home of target facts: what a build needs (:data:`BUILD_TARGETS`: SM,
platform, builder workspace) and memory, bandwidth and peak FLOP/s of each deployment target.

The build (``pipeline/stages/``), the farm (node routing, matrix order) and the estimate read it.
Used by ``trtpipe estimate`` (see :mod:`trtpipe.pipeline.estimate` and ``docs/estimate.md``).
GPU rows are **published peaks** (data sheets), not measurements; the host CPU row is measured
once per process (a NumPy copy for bandwidth, a float32 matmul for FLOP/s) unless the caller
passes its own :class:`HostMeasurement`.

A roofline needs what an engine can reach, not the peak: each row carries the fraction of peak
bandwidth and of peak FLOP/s that the estimate assumes (0.8 and 0.6 on GPUs; 1.0 on the CPU,
whose numbers are already measured). Physical floors (budgets no engine can meet) use the peaks.

Units are in the names: ``*_bytes``, ``*_bytes_per_s``, ``*_flops_per_s`` (FLOP/s, one
multiply-add = 2 FLOP).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from trtpipe.plugins.core.errors import TrtpipeError

GiB = 2**30

# Compute dtypes a phase can run its GEMMs in (see compute_dtype).
COMPUTE_DTYPES = ("fp32", "tf32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class TargetSpec:
    """One row of the target table.

    ``family`` is the recipe ``target`` this row belongs to (``a100-40gb`` is an ``a100``).
    ``memory_bytes``: device memory (unified LPDDR5 on Orin, host RAM on cpu);
    ``reserved_bytes``: the part an engine cannot have (CUDA context and libraries; on Orin the
    OS and the CPU side of unified memory; on cpu what other processes use now).
    ``peak_flops``: ``((compute dtype, dense FLOP/s), ...)``.
    """

    name: str
    family: str  # cpu | orin | a100 | h200
    description: str
    memory_bytes: int
    reserved_bytes: int
    bandwidth_bytes_per_s: float  # peak (GPU, published) or measured (cpu)
    peak_flops: tuple[tuple[str, float], ...]
    bandwidth_fraction: float  # achievable fraction of bandwidth_bytes_per_s
    flops_fraction: float  # achievable fraction of peak_flops
    measured: bool  # True: numbers measured on this host; False: published peaks
    source: str  # where the numbers come from

    @property
    def usable_memory_bytes(self) -> int:
        """Memory an engine (weights + KV pool + activations) may use."""
        return max(0, self.memory_bytes - self.reserved_bytes)

    @property
    def achievable_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.bandwidth_fraction

    def flops_per_s(self, dtype: str) -> float:
        """Peak dense FLOP/s for GEMMs in ``dtype`` (one of :data:`COMPUTE_DTYPES`)."""
        table = dict(self.peak_flops)
        if dtype not in table:
            raise TrtpipeError(f"target {self.name}: no FLOP/s for compute dtype {dtype!r}; known: {', '.join(table)}")
        return table[dtype]

    def achievable_flops_per_s(self, dtype: str) -> float:
        return self.flops_per_s(dtype) * self.flops_fraction

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            "memory_bytes": self.memory_bytes,
            "reserved_bytes": self.reserved_bytes,
            "usable_memory_bytes": self.usable_memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_fraction": self.bandwidth_fraction,
            "peak_flops_per_s": dict(self.peak_flops),
            "flops_fraction": self.flops_fraction,
            "measured": self.measured,
            "source": self.source,
        }


# --------------------------------------------------------------------------------------------
# GPU rows: published peaks
# --------------------------------------------------------------------------------------------
# Jetson AGX Orin Series Technical Brief (v1.2) and module data sheets. AGX Orin 64 GB: GPU of
# 2048 CUDA cores (5.3 FP32 TFLOPS) and 64 third-generation Tensor Cores at 1.3 GHz, 170 sparse
# INT8 TOPS on the GPU (275 TOPS with the two DLAs) -> 85 dense INT8 TOPS; Ampere Tensor Cores run
# FP16/BF16 at half the INT8 rate (42.5 TFLOPS dense, = 64 TC x 1.3 GHz x 512 FLOP/clk) and TF32
# at half the FP16 rate (derived, not published). 204.8 GB/s 256-bit LPDDR5, unified with the CPU.
# AGX Orin 32 GB: 1792 cores and 56 Tensor Cores at 930 MHz (3.3 FP32 TFLOPS; FP16 dense derived
# the same way: 56 x 0.93 GHz x 512 = 26.7 TFLOPS), same 204.8 GB/s.
_ORIN_SOURCE = (
    "Jetson AGX Orin technical brief / data sheet (published peaks; TF32 derived as FP16/2; DLAs not counted)"
)
# NVIDIA A100 data sheet (SXM): FP16/BF16 Tensor 312 TFLOPS dense, TF32 156, FP32 19.5, INT8 624;
# 40 GB HBM2 at 1,555 GB/s, 80 GB HBM2e at 2,039 GB/s.
_A100_SOURCE = "NVIDIA A100 data sheet, SXM (published dense peaks)"
# NVIDIA H200 data sheet (SXM): 141 GB HBM3e at 4.8 TB/s; FP16/BF16 Tensor 989 TFLOPS dense
# (1,979 with sparsity), TF32 494.5 dense, FP32 67, INT8 1,979 dense.
_H200_SOURCE = "NVIDIA H200 data sheet, SXM (published dense peaks)"

# Achievable fractions on GPUs: well-tuned GEMM/attention kernels reach ~80% of DRAM bandwidth
# in decode and ~60% of Tensor Core peak in prefill (a planning assumption, printed with every
# estimate). Memory reserves: CUDA context + cuBLAS/TensorRT libraries (~1 GiB); on Orin the
# memory is shared with Linux and the CPU side of the application (4 GiB kept for them).
GPU_BANDWIDTH_FRACTION = 0.8
GPU_FLOPS_FRACTION = 0.6
GPU_RESERVED_BYTES = 1 * GiB
ORIN_RESERVED_BYTES = 4 * GiB


@dataclass(frozen=True)
class BuildTarget:
    """What a build for a recipe ``target`` needs to know: the GPU architecture its TensorRT plans
    are tuned for (``sm``: major * 10 + minor; None on cpu), the CPU platform of the device, and the
    default TensorRT builder workspace limit. Plans are not portable across SMs or platforms."""

    name: str  # the recipe ``target``: cpu | orin | a100 | h200
    sm: int | None
    platform: str | None  # "aarch64" | "x86_64"; None: the build host itself (cpu)
    workspace_mib: int  # TensorRT builder workspace pool default (engine.workspace_mib overrides)
    description: str


# One row per recipe ``target`` (DESIGN.md's target table). The farm routes cells by sm/platform.
BUILD_TARGETS: dict[str, BuildTarget] = {
    "cpu": BuildTarget("cpu", None, None, 0, "host CPU (ONNX Runtime CPU EP)"),
    "orin": BuildTarget("orin", 87, "aarch64", 2048, "Jetson AGX Orin (sm_87, unified LPDDR5)"),
    "a100": BuildTarget("a100", 80, "x86_64", 8192, "A100 (sm_80)"),
    "h200": BuildTarget("h200", 90, "x86_64", 16384, "H200 (sm_90)"),
}
TARGET_FAMILIES: tuple[str, ...] = tuple(BUILD_TARGETS)  # the recipe ``target`` values, in table order
GPU_BUILD_TARGETS: dict[str, BuildTarget] = {k: v for k, v in BUILD_TARGETS.items() if v.sm is not None}


@dataclass(frozen=True)
class PeakTflops:
    """Published dense peaks of a GPU, TFLOP/s (bf16 runs at the fp16 rate on these parts)."""

    fp32: float
    tf32: float
    fp16: float
    int8: float


_ORIN_64GB_TFLOPS = PeakTflops(fp32=5.3, tf32=21.25, fp16=42.5, int8=85)
_ORIN_32GB_TFLOPS = PeakTflops(fp32=3.33, tf32=13.3, fp16=26.7, int8=53.4)
_A100_TFLOPS = PeakTflops(fp32=19.5, tf32=156, fp16=312, int8=624)
_H200_TFLOPS = PeakTflops(fp32=67, tf32=494.5, fp16=989, int8=1979)


def _gpu_row(
    name: str, description: str, memory_gib: int, bandwidth_bytes_per_s: float, source: str, peaks: PeakTflops
) -> TargetSpec:
    """A GPU row from its data sheet: memory (GiB), read bandwidth (bytes/s) and dense peaks."""
    family = name.split("-")[0]
    reserved = ORIN_RESERVED_BYTES if family == "orin" else GPU_RESERVED_BYTES
    t = 1e12
    flops = (
        ("fp32", peaks.fp32 * t),
        ("tf32", peaks.tf32 * t),
        ("fp16", peaks.fp16 * t),
        ("bf16", peaks.fp16 * t),
        ("int8", peaks.int8 * t),
    )
    return TargetSpec(
        name, family, description, memory_gib * GiB, reserved, bandwidth_bytes_per_s, flops,
        GPU_BANDWIDTH_FRACTION, GPU_FLOPS_FRACTION, False, source,
    )  # fmt: skip


GPU_TARGETS: dict[str, TargetSpec] = {
    r.name: r
    for r in (
        _gpu_row(
            "orin",
            "Jetson AGX Orin 64 GB (sm_87, unified LPDDR5; a 32 GB module: orin-32gb)",
            64,
            204.8e9,
            _ORIN_SOURCE,
            _ORIN_64GB_TFLOPS,
        ),
        _gpu_row(
            "orin-32gb", "Jetson AGX Orin 32 GB (sm_87, unified LPDDR5)", 32, 204.8e9, _ORIN_SOURCE, _ORIN_32GB_TFLOPS
        ),
        _gpu_row(
            "a100", "A100 80 GB SXM (sm_80, HBM2e; the 40 GB card: a100-40gb)", 80, 2.039e12, _A100_SOURCE, _A100_TFLOPS
        ),
        _gpu_row("a100-40gb", "A100 40 GB SXM (sm_80, HBM2)", 40, 1.555e12, _A100_SOURCE, _A100_TFLOPS),
        _gpu_row("h200", "H200 141 GB SXM (sm_90, HBM3e)", 141, 4.8e12, _H200_SOURCE, _H200_TFLOPS),
    )
}


# --------------------------------------------------------------------------------------------
# The host CPU: measured
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostMeasurement:
    """What this host does, measured (or given, to skip measuring).

    ``bandwidth_bytes_per_s``: (bytes read + bytes written) / time of a NumPy copy of a 256 MiB
    float32 array (one thread; on the 2-core dev machines this matches the ~26 GB/s two-thread
    read figure of TOOLCHAIN.md). ``fp32_flops_per_s``: 2 * 2048**3 / time of a 2048^3 float32
    matmul (NumPy's BLAS, all cores). Both best of a few runs. Memory from ``/proc/meminfo``.
    """

    bandwidth_bytes_per_s: float
    fp32_flops_per_s: float
    memory_total_bytes: int
    memory_available_bytes: int
    num_cpus: int
    seconds: float = 0.0  # how long measuring took (0 when given)


def _meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; (0, 0) where it does not exist."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 0, 0
    vals: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            vals[key] = int(parts[0]) * 1024  # kB
    total = vals.get("MemTotal", 0)
    return total, vals.get("MemAvailable", total)


def _measure() -> HostMeasurement:
    import numpy as np

    t0 = time.perf_counter()
    src = np.ones(256 * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    bandwidth = 2 * src.nbytes / best
    del src, dst
    n = 2048
    a = np.ones((n, n), dtype=np.float32)
    a @ a  # warm the BLAS threads
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    total, avail = _meminfo()
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        ncpu = os.cpu_count() or 1
    return HostMeasurement(bandwidth, 2 * n**3 / best, total, avail, ncpu, time.perf_counter() - t0)


_HOST: HostMeasurement | None = None


def measure_host(*, refresh: bool = False) -> HostMeasurement:
    """Measure this host once per process (~0.5 s) and cache it; ``refresh`` measures again."""
    global _HOST
    if _HOST is None or refresh:
        _HOST = _measure()
    return _HOST


def cpu_target(host: HostMeasurement | None = None) -> TargetSpec:
    """The ``cpu`` row from a measurement (``host``, or :func:`measure_host`).

    Usable memory is what the kernel reports as available now (MemAvailable): the host is
    shared with other processes. Every precision computes at the measured fp32 rate: ONNX
    Runtime's CPU GEMMs are fp32 (INT4 weights are dequantized, or with accuracy_level 4 run
    int8 dot products at roughly that rate or better on AVX2).
    """
    h = host if host is not None else measure_host()
    f = h.fp32_flops_per_s
    how = "given" if host is not None and host.seconds == 0 else "measured"
    return TargetSpec(
        "cpu",
        "cpu",
        f"host CPU ({h.num_cpus} cores, ONNX Runtime CPU EP)",
        h.memory_total_bytes,
        max(0, h.memory_total_bytes - h.memory_available_bytes),
        h.bandwidth_bytes_per_s,
        (("fp32", f), ("tf32", f), ("fp16", f), ("bf16", f), ("int8", f)),
        1.0,
        1.0,
        True,
        f"{how} on this host: NumPy copy of 256 MiB (read+write bytes / s), 2048^3 float32 "
        "matmul; memory from /proc/meminfo (MemAvailable)",
    )


TARGET_NAMES: tuple[str, ...] = ("cpu", *GPU_TARGETS)


def get_target(name: str, *, host: HostMeasurement | None = None) -> TargetSpec:
    """The table row called ``name`` (``cpu``, ``orin``, ``orin-32gb``, ``a100``, ``a100-40gb``,
    ``h200``). ``cpu`` measures the host unless ``host`` is given. Raises :class:`TrtpipeError`
    for an unknown name."""
    if name == "cpu":
        return cpu_target(host)
    if name in GPU_TARGETS:
        return GPU_TARGETS[name]
    import difflib

    close = difflib.get_close_matches(name, TARGET_NAMES, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(TARGET_NAMES)}"
    raise TrtpipeError(f"target {name!r}: expected one of {', '.join(TARGET_NAMES)}. Fix: {hint}")


def compute_dtype(precision: str, family: str) -> str:
    """The dtype a phase's GEMMs run in on a target family.

    cpu: fp32 (ONNX Runtime CPU). GPU: fp32 weights run TF32 (TensorRT enables TF32 by
    default), fp16/bf16 as is, int4 (weight-only) dequantizes to fp16 in the kernel.
    """
    if family == "cpu":
        return "fp32"
    return {"fp32": "tf32", "fp16": "fp16", "bf16": "bf16", "int4": "fp16"}[precision]
