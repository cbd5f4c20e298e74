"""What a farm node can build: probe the machine, decide which target labels it can honour, and
the ``ray start`` command that advertises them.

A node advertises a target with the Ray custom resource ``trtpipe_target_<target>`` (Ray does
not detect Jetson GPUs itself, and "has an A100" is not "can build A100 plans"), declared when
the node starts::

    ray start --address HEAD:6379 --resources '{"trtpipe_target_orin": 1}'

The resource amount is 1: one build per target at a time on a node (a TensorRT build uses the
whole GPU and several times the model's bytes of host memory). Probes never raise: a tool that
is missing is a fact about the node.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trtpipe.pipeline.targets import BUILD_TARGETS

RESOURCE_PREFIX = "trtpipe_target_"

# target -> (CPU platform, GPU SM); cpu has no GPU. From the one target table (pipeline/targets.py).
TARGET_HARDWARE: dict[str, tuple[str | None, int | None]] = {t.name: (t.platform, t.sm) for t in BUILD_TARGETS.values()}


def resource_name(target: str) -> str:
    """``trtpipe_target_<target>``: the Ray custom resource a node declares for ``target``."""
    return f"{RESOURCE_PREFIX}{target}"


@dataclass(frozen=True)
class GpuInfo:
    name: str
    sm: int  # compute capability major*10 + minor (8.7 -> 87)
    memory_bytes: int | None


@dataclass(frozen=True)
class NodeProbe:
    """Facts about this machine that decide which targets it can build."""

    hostname: str
    platform: str  # platform.machine(): x86_64, aarch64
    num_cpus: int
    memory_bytes: int  # total host memory (MemTotal)
    memory_available_bytes: int  # MemAvailable at probe time
    gpus: tuple[GpuInfo, ...]  # from nvidia-smi; () when absent
    jetson: str | None  # /etc/nv_tegra_release first line on a Jetson (L4T version), else None
    tensorrt_version: str | None  # `import tensorrt` works -> its version
    tensorrt_error: str | None  # why it does not, first line

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["gpus"] = [g.__dict__ for g in self.gpus]
        return d


def _meminfo_bytes() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; (0, 0) where it does not exist."""
    vals: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            vals[k] = int(v.split()[0]) * 1024  # kB
    except (OSError, ValueError):
        return 0, 0
    return vals.get("MemTotal", 0), vals.get("MemAvailable", 0)


def _nvidia_smi_gpus() -> tuple[GpuInfo, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            major, minor = parts[1].split(".")
            sm = int(major) * 10 + int(minor)
        except ValueError:
            continue
        mem = int(parts[2]) * 2**20 if parts[2].isdigit() else None  # MiB; "[N/A]" on Jetson (unified memory)
        gpus.append(GpuInfo(parts[0], sm, mem))
    return tuple(gpus)


def _tensorrt() -> tuple[str | None, str | None]:
    """Import-probe TensorRT in a child process (a broken install can abort the importer)."""
    import sys

    code = "import tensorrt, sys; sys.stdout.write(tensorrt.__version__)"
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return None, str(e)
    if p.returncode == 0 and p.stdout.strip():
        return p.stdout.strip(), None
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return None, (lines[-1] if lines else f"exit code {p.returncode}")


def probe_node() -> NodeProbe:
    """Probe this machine (nvidia-smi, /etc/nv_tegra_release, TensorRT import, /proc/meminfo)."""
    total, avail = _meminfo_bytes()
    tegra = Path("/etc/nv_tegra_release")
    jetson = tegra.read_text(errors="replace").splitlines()[0].strip() if tegra.is_file() else None
    trt_version, trt_error = _tensorrt()
    return NodeProbe(
        socket.gethostname(),
        platform.machine(),
        os.cpu_count() or 1,
        total,
        avail,
        _nvidia_smi_gpus(),
        jetson,
        trt_version,
        trt_error,
    )


def refusal(probe: NodeProbe, target: str) -> str | None:
    """Why this node cannot honour the label ``target``, or None when it can.

    cpu: always (ONNX Runtime CPU). GPU targets: the CPU platform of the target, a GPU with the
    target's SM (Orin: a Jetson, whose GPU nvidia-smi may not list), and an importable TensorRT
    (without it a build stops at its build spec, which any machine can write).
    """
    if target not in TARGET_HARDWARE:
        return f"unknown target {target!r}; expected one of {sorted(TARGET_HARDWARE)}"
    plat, sm = TARGET_HARDWARE[target]
    if sm is None:
        return None
    reasons = []
    if probe.platform != plat:
        reasons.append(f"this machine is {probe.platform}, target {target} is {plat}")
    has_sm = any(g.sm == sm for g in probe.gpus) or (target == "orin" and probe.jetson is not None)
    if not has_sm:
        seen = ", ".join(f"{g.name} (sm_{g.sm})" for g in probe.gpus) or "no NVIDIA GPU (nvidia-smi absent or empty)"
        reasons.append(f"target {target} needs an sm_{sm} GPU, this machine has {seen}")
    if probe.tensorrt_version is None:
        reasons.append(
            f"TensorRT is not importable here ({probe.tensorrt_error}); without it a build stops at its build spec"
        )
    return "; ".join(reasons) or None


def ray_start_command(
    target: str, address: str | None, num_cpus: int | None = None, memory_bytes: int | None = None
) -> list[str]:
    """The ``ray start`` argv that joins ``address`` (or starts a head when None) advertising
    ``trtpipe_target_<target>``; ``memory_bytes`` caps the logical memory Ray schedules against."""
    cmd = ["ray", "start"]
    cmd += ["--address", address] if address else ["--head"]
    cmd += ["--resources", json.dumps({resource_name(target): 1})]
    if num_cpus is not None:
        cmd += ["--num-cpus", str(num_cpus)]
    if memory_bytes is not None:
        cmd += ["--memory", str(memory_bytes)]
    return cmd


def format_command(cmd: list[str]) -> str:
    return shlex.join(cmd)
