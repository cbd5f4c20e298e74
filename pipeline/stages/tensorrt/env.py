"""What this machine offers for a TensorRT build, and what it lacks for a given target."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from trtpipe.pipeline.targets import GPU_BUILD_TARGETS


@dataclass(frozen=True)
class TrtEnvironment:
    """What this machine offers for a TensorRT build."""

    trt_version: str | None  # enterprise TensorRT, None when `import tensorrt` fails
    trt_error: str | None
    gpu_sm: int | None
    gpu_name: str | None
    cuda_runtime: str | None
    platform: str
    triton_version: str | None


def probe_environment() -> TrtEnvironment:
    """Import-probe TensorRT and Triton and query GPU 0 (ctypes CUDA runtime); never raises."""
    from trtpipe.runtime.engines.cuda_device import cuda_device_info

    version = err = None
    try:
        import tensorrt as trt

        version = trt.__version__
    except Exception as e:  # ImportError, or OSError for a stub package without its libraries
        err = f"{type(e).__name__}: {e}"
    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = None
    dev = cuda_device_info()
    return TrtEnvironment(
        version,
        err,
        dev.sm if dev else None,
        dev.name if dev else None,
        dev.runtime_version if dev else None,
        platform.machine(),
        tv,
    )


def missing_for_target(env: TrtEnvironment, target: str) -> list[str]:
    """What ``env`` lacks to build plans for ``target`` (empty: it can), one phrase each."""
    t = GPU_BUILD_TARGETS[target]
    out = []
    if env.trt_version is None:
        out.append(
            "the TensorRT Python package `tensorrt` is not importable here"
            + (f" ({env.trt_error.splitlines()[0][:160]})" if env.trt_error else "")
        )
    if env.gpu_sm is None:
        out.append(f"no NVIDIA GPU is visible (target {target} needs an sm_{t.sm} GPU: TensorRT tunes the plans on it)")
    elif env.gpu_sm != t.sm:
        out.append(
            f"the GPU here is sm_{env.gpu_sm} ({env.gpu_name}), target {target} is sm_{t.sm}; plans are not "
            "portable across GPU architectures"
        )
    if env.platform != t.platform:
        out.append(f"this machine is {env.platform}, target {target} is {t.platform}")
    return out
