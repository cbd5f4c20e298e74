"""The CUDA runtime through ``ctypes``: device facts, device buffers, async copies.

Deploy side and dependency-free: ``libcudart`` comes from the system (JetPack on an Orin, the
CUDA toolkit) or the ``nvidia-cuda-runtime`` wheel; no torch, no cuda-python. A handful of
calls (``cudaGetDeviceCount``, ``cudaDeviceGetAttribute``, ``cudaMalloc``, ``cudaMemcpyAsync``,
streams) is all the TensorRT engine (:mod:`trtpipe.runtime.engines.trt`) and the build side's
target detection need. Every failing call raises :class:`CudaError` with CUDA's own message.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtpipe.runtime.errors import ArtifactError

__all__ = [
    "CudaError",
    "CudaDeviceInfo",
    "DeviceBuffer",
    "check_cuda",
    "cuda_device_info",
    "load_cudart",
    "memcpy_dtoh",
    "memcpy_htod",
]


class CudaError(ArtifactError):
    """The CUDA runtime is missing, has no device, or a call failed."""


_CUDART: Any = None


def load_cudart() -> Any:
    """``libcudart`` from the system (JetPack, CUDA toolkit) or the ``nvidia-cuda-runtime``
    wheel; raises :class:`CudaError` naming where it looked."""
    global _CUDART
    if _CUDART is not None:
        return _CUDART
    names = []
    found = ctypes.util.find_library("cudart")
    if found:
        names.append(found)
    for root in (
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/aarch64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ):
        names += sorted(glob.glob(os.path.join(root, "libcudart.so*")))
    try:
        import nvidia.cuda_runtime as _ncr  # type: ignore  # pip wheel, if installed

        for p in _ncr.__path__:
            names += sorted(glob.glob(os.path.join(p, "lib", "libcudart.so*")))
    except Exception:
        pass
    errors = []
    for n in names:
        try:
            _CUDART = ctypes.CDLL(n)
            return _CUDART
        except OSError as e:
            errors.append(f"{n}: {e}")
    raise CudaError(
        "the CUDA runtime library (libcudart) was not found"
        + (f" ({'; '.join(errors)})" if errors else "")
        + ". Fix: install the CUDA runtime (JetPack on Orin; the CUDA toolkit or "
        "`pip install nvidia-cuda-runtime-cu12` elsewhere)."
    )


def check_cuda(rc: int, what: str) -> None:
    if rc != 0:
        lib = load_cudart()
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        msg = lib.cudaGetErrorString(rc).decode(errors="replace")
        raise CudaError(f"CUDA {what} failed: error {rc} ({msg})")


@dataclass(frozen=True)
class CudaDeviceInfo:
    """Device 0 as this process sees it."""

    sm: int  # 80, 87, 90 (major * 10 + minor)
    name: str
    total_memory_bytes: int
    runtime_version: str  # "12.6"
    driver_version: str


def cuda_device_info() -> CudaDeviceInfo | None:
    """Facts about GPU 0, or None when there is no CUDA runtime or no device.

    Uses ``cudaGetDeviceCount``, ``cudaDeviceGetAttribute`` (75/76 = compute capability
    major/minor), ``cudaRuntimeGetVersion``, ``cudaDriverGetVersion``, ``cudaMemGetInfo``.
    """
    try:
        lib = load_cudart()
    except CudaError:
        return None
    n = ctypes.c_int(0)
    if lib.cudaGetDeviceCount(ctypes.byref(n)) != 0 or n.value < 1:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if lib.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0) or lib.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0):
        return None
    rt, drv = ctypes.c_int(0), ctypes.c_int(0)
    lib.cudaRuntimeGetVersion(ctypes.byref(rt))
    lib.cudaDriverGetVersion(ctypes.byref(drv))
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    name = ""
    try:  # cudaDeviceProp starts with char name[256]; the struct is larger: over-allocate
        buf = ctypes.create_string_buffer(8192)
        if lib.cudaGetDeviceProperties(buf, 0) == 0:
            name = buf.value.decode(errors="replace")
    except Exception:
        pass
    fmt = lambda v: f"{v // 1000}.{(v % 1000) // 10}"  # noqa: E731  (12060 -> "12.6")
    return CudaDeviceInfo(major.value * 10 + minor.value, name, total.value, fmt(rt.value), fmt(drv.value))


class DeviceBuffer:
    """``cudaMalloc``'d bytes, freed on :meth:`free` or garbage collection."""

    def __init__(self, nbytes: int):
        self.nbytes = int(max(nbytes, 1))
        self.ptr = ctypes.c_void_p()
        check_cuda(
            load_cudart().cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes)), f"cudaMalloc({self.nbytes})"
        )
        check_cuda(load_cudart().cudaMemset(self.ptr, 0, ctypes.c_size_t(self.nbytes)), "cudaMemset")

    @property
    def address(self) -> int:
        return int(self.ptr.value or 0)

    def free(self) -> None:
        if self.ptr.value:
            load_cudart().cudaFree(self.ptr)
            self.ptr = ctypes.c_void_p()

    def __del__(self) -> None:  # best effort at interpreter exit
        try:
            self.free()
        except Exception:
            pass


_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind


def memcpy_htod(dst: int, arr: np.ndarray, stream: int) -> None:
    """Copy host ``arr`` (made contiguous) to device address ``dst`` on ``stream`` (async)."""
    arr = np.ascontiguousarray(arr)
    rc = load_cudart().cudaMemcpyAsync(
        ctypes.c_void_p(dst),
        arr.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_size_t(arr.nbytes),
        _HOST_TO_DEVICE,
        ctypes.c_void_p(stream),
    )
    check_cuda(rc, "cudaMemcpyAsync H2D")


def memcpy_dtoh(out: np.ndarray, src: int, stream: int) -> None:
    """Copy ``out.nbytes`` from device address ``src`` into contiguous host ``out`` on ``stream``
    (async: synchronize the stream before reading ``out``)."""
    rc = load_cudart().cudaMemcpyAsync(
        out.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_void_p(src),
        ctypes.c_size_t(out.nbytes),
        _DEVICE_TO_HOST,
        ctypes.c_void_p(stream),
    )
    check_cuda(rc, "cudaMemcpyAsync D2H")
