"""Which CPU this process runs on, as one line: the key that host-specific measurements keep.

The machines this project runs on share one host name ("vm") but not one processor: session 5's
was an AMD EPYC family 25 model 17 (Zen 4, AVX-512 + VNNI + BF16), session 6's a family 25 model 1
(Zen 3: AVX2 only; an AVX-512 instruction raises SIGILL there), and ONNX Runtime's int4 GEMM ran
~3x slower on the latter. A step-cost model, or any timing, measured on one is wrong on the other,
so what is cached per host is keyed by :func:`host_id` (host name + CPU), not the host name.
"""

from __future__ import annotations

import platform
from pathlib import Path

# The SIMD features that decide which kernels ONNX Runtime / llama.cpp pick on x86.
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def cpu_identity(cpuinfo_text: str | None = None) -> str:
    """``"<vendor> family <f> model <m> [<simd flags>]"`` from ``/proc/cpuinfo`` (its first
    processor; ``cpuinfo_text`` instead of reading it, for tests); ``platform.processor()`` (or
    ``platform.machine()``) where there is no ``/proc/cpuinfo``."""
    if cpuinfo_text is None:
        try:
            cpuinfo_text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in cpuinfo_text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    simd = " ".join(f for f in SIMD_FLAGS if f in flags) or "no x86 SIMD flags"
    vendor = fields.get("vendor_id") or platform.machine()
    return f"{vendor} family {fields.get('cpu family', '?')} model {fields.get('model', '?')} [{simd}]"


def host_id() -> str:
    """``"<host name> / <cpu_identity()>"``."""
    return f"{platform.node()} / {cpu_identity()}"


__all__ = ["SIMD_FLAGS", "cpu_identity", "host_id"]
