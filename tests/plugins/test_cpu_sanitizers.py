"""The host CPU kernels under AddressSanitizer and UBSan: the kernel tests and the native
engine's boundary tests (10,000 malformed steps, two engines at once, manifests that disagree
with their weights) rerun in a child pytest whose library is compiled with
``-fsanitize=address,undefined -fno-sanitize-recover=all`` (plugins/cpu/compile.py
``TRTPIPE_CPU_SANITIZE``; the default artifact's library swapped by tests/conftest.py), the
sanitizer runtime preloaded. Any invalid read or write, leak-free or not, or undefined behaviour
in C aborts the child: the test fails with the sanitizer's report. ~2-3 min on a 2-core Zen 3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.plugins.cpu.compile import compiler
from trtpipe.plugins.cpu.isa import host_isa

REPO = Path(__file__).resolve().parents[2]
SANITIZED_TESTS = (
    "tests/plugins/test_cpu_kernels.py",
    "tests/plugins/test_cpu_i8_kernels.py",
    "tests/runtime/test_native_boundary.py",
)


def _runtime(name: str) -> str | None:
    cc = compiler()
    if cc is None:
        return None
    out = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


@pytest.mark.slow
@pytest.mark.skipif(host_isa() is None or compiler() is None, reason="needs x86-64 AVX2 and a C compiler")
def test_kernels_and_engine_boundary_pass_under_address_and_ub_sanitizers(default_artifact, tmp_path):
    asan = _runtime("libasan.so")
    if asan is None:
        pytest.skip("the C compiler has no AddressSanitizer runtime (libasan.so)")
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=asan,
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86",  # Python's own allocations are not leaks
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87",
        TRTPIPE_CPU_SANITIZE="address,undefined",
        TRTPIPE_CACHE=str(tmp_path / "cache"),
        TRTPIPE_TEST_DEFAULT_ARTIFACT=str(default_artifact),  # built once, by this run
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"),
           *SANITIZED_TESTS]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, f"exit {r.returncode} under the sanitizers:\n{tail}"
    assert "passed" in r.stdout and "failed" not in r.stdout.splitlines()[-1], tail
