"""mypy over runtime/ (the torch-free deploy side) and plugins/ (op contracts, lowerings, kernels)
finds no error, with the settings in pyproject.toml's ``[tool.mypy]``.

runtime/ is the package ``trtpipe.runtime`` through setuptools' package-dir mapping, which mypy
cannot follow through an editable install, so the test lays out ``trtpipe/runtime`` and
``trtpipe/plugins`` as links in a temp folder and points MYPYPATH there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MYPY_TIMEOUT_S = 300


def test_mypy_finds_no_error_in_runtime_and_plugins(tmp_path):
    pkg = tmp_path / "trtpipe"
    pkg.mkdir()
    for name in ("runtime", "plugins"):
        (pkg / name).symlink_to(ROOT / name, target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "-p",
            "trtpipe.runtime",
            "-p",
            "trtpipe.plugins",
        ],
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:].replace(str(tmp_path) + "/", "")
    assert "Success: no issues found" in r.stdout
