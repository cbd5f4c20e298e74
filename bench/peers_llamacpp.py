"""llama.cpp built for the host it runs on: one CMake build of the llama.cpp sources vendored in the
llama-cpp-python sdist, with explicit ISA flags chosen from the host's CPU flags (never
``GGML_NATIVE``), giving both the shared library llama-cpp-python loads (bench/peers.py's
``llama.cpp`` peer, through ``LLAMA_CPP_LIB_PATH``) and llama.cpp's own ``llama-server``
(bench/serve.py's ``llama-server`` anchor). One build, so both anchors run the same kernels.

Why not ``GGML_NATIVE``: on the Intel AMX host (2026-12-02) llama-cpp-python built with
``GGML_NATIVE=ON`` died with SIGSEGV in every round; ``-march=native`` turns on ggml's AMX
backend, whose ``ggml_backend_amx_mul_mat`` segfaults on some AMX machines (llama.cpp issue
#20824, left unfixed; dspy PR #10079 removed the AMX variant for the same crash). So AMX is off
unless asked for (``--llama-amx``); AVX-512 VNNI/BF16 stay on where the host has them.

Layout (``<bench dir>/.venv-bench-llamacpp/``): the sdist, ``src/`` (it, unpacked), ``build/``
(``build/bin/llama-server``, ``build/bin/libllama.so`` and the ggml libraries), ``build.json``
(the flags, the times, the host it was built on).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"

# (CPU flag(s) in /proc/cpuinfo, the ggml CMake option they allow). GGML_AVX512 compiles with
# -mavx512f/cd/vl/dq/bw, so it needs all five.
ISA_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("sse4_2",), "GGML_SSE42"),
    (("avx",), "GGML_AVX"),
    (("avx2",), "GGML_AVX2"),
    (("bmi2",), "GGML_BMI2"),
    (("fma",), "GGML_FMA"),
    (("f16c",), "GGML_F16C"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
    (("avx512vbmi",), "GGML_AVX512_VBMI"),
    (("avx512_vnni",), "GGML_AVX512_VNNI"),
    (("avx512_bf16",), "GGML_AVX512_BF16"),
)
AMX_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("amx_tile",), "GGML_AMX_TILE"),
    (("amx_tile", "amx_int8"), "GGML_AMX_INT8"),
    (("amx_tile", "amx_bf16"), "GGML_AMX_BF16"),
)


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` (empty when unreadable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isa_cmake_options(cpu_flags: set[str], amx: bool = False) -> dict[str, bool]:
    """ggml's ISA options for a CPU with ``cpu_flags``: each ON exactly when the CPU has every flag
    it needs; the AMX options ON only when ``amx`` is asked for (see the module docstring) and the
    CPU has them. A base ISA missing (e.g. AVX-512 on a Zen 3, which raises SIGILL) is OFF, so the
    build runs on the host it was built for and on any host with at least those flags."""
    opts = {name: all(f in cpu_flags for f in need) for need, name in ISA_OPTIONS}
    for need, name in AMX_OPTIONS:
        opts[name] = amx and all(f in cpu_flags for f in need)
    return opts


def cmake_args(options: dict[str, bool]) -> list[str]:
    """``-DGGML_NATIVE=OFF`` and every ISA option spelled out (``-DGGML_AVX2=ON`` ...)."""
    return ["-DGGML_NATIVE=OFF"] + [f"-D{k}={'ON' if v else 'OFF'}" for k, v in options.items()]


def llamacpp_dir(bench_dir: Path) -> Path:
    return bench_dir / ".venv-bench-llamacpp"


def lib_dir(bench_dir: Path) -> Path:
    """Where ``libllama.so`` lies (the ``LLAMA_CPP_LIB_PATH`` of llama-cpp-python)."""
    return llamacpp_dir(bench_dir) / "build" / "bin"


def server_binary(bench_dir: Path) -> Path:
    return lib_dir(bench_dir) / "llama-server"


def sdist_path(bench_dir: Path) -> Path | None:
    found = sorted(llamacpp_dir(bench_dir).glob("llama_cpp_python-*.tar.gz"))
    return found[-1] if found else None


def _run(cmd: list[str], log: Path, env: dict | None = None, timeout_s: float = 7200) -> None:
    """Run ``cmd`` with its output appended to ``log``; raises RuntimeError with the log's tail."""
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
    if p.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])[-800:]
        raise RuntimeError(f"exit {p.returncode} from {cmd[0]} {cmd[1] if len(cmd) > 1 else ''}: {tail}")


def fetch_sources(bench_dir: Path, log: Path) -> Path:
    """The llama-cpp-python sdist (``pip download --no-binary``), unpacked to ``src/``."""
    d = llamacpp_dir(bench_dir)
    d.mkdir(parents=True, exist_ok=True)
    if sdist_path(bench_dir) is None:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        _run(pip + [LLAMA_CPP_PYTHON, "-d", str(d)], log)
    src = d / "src"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        tmp = d / "src.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(sdist_path(bench_dir)) as t:
            t.extractall(tmp, filter="data")
        (top,) = list(tmp.iterdir())
        top.rename(src)
        tmp.rmdir()
    return src / "vendor" / "llama.cpp"


def build(bench_dir: Path, amx: bool = False, log=print) -> dict:
    """Configure and build ``llama`` (shared) and ``llama-server``; returns the step record
    (``ok``, ``seconds``, ``error``, the CMake options, the host flags). ~10-20 min on 2 cores."""
    d = llamacpp_dir(bench_dir)
    d.mkdir(parents=True, exist_ok=True)
    logf = d / "build.log"
    opts = isa_cmake_options(host_cpu_flags(), amx=amx)
    rec: dict = {"options": {k: v for k, v in opts.items()}, "amx_requested": amx}
    t = time.monotonic()
    try:
        src = fetch_sources(bench_dir, logf)
        configure = ["cmake", "-S", str(src), "-B", str(d / "build"), "-DCMAKE_BUILD_TYPE=Release"]
        configure += ["-G", "Ninja"] if shutil.which("ninja") else []
        configure += ["-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
        configure += ["-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF"]
        _run(configure + cmake_args(opts), logf)
        jobs = str(os.cpu_count() or 2)
        log(f"setup: building llama.cpp (libllama + llama-server, {jobs} jobs; 10-20 min on 2 cores) ...")
        _run(["cmake", "--build", str(d / "build"), "--target", "llama", "llama-server", "-j", jobs], logf)
        rec.update(ok=True, error="")
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        rec.update(ok=False, error=str(e)[:900])
    rec.update(seconds=round(time.monotonic() - t, 1), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (d / "build.json").write_text(json.dumps(rec, indent=1))
    return rec


def built(bench_dir: Path) -> bool:
    return (lib_dir(bench_dir) / "libllama.so").is_file() and server_binary(bench_dir).is_file()
