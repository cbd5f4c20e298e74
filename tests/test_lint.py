"""ruff lint and format hold over the whole tree, with the settings in pyproject.toml's
``[tool.ruff]`` (line length 120; pyflakes, pycodestyle, isort, bugbear, pyupgrade). Fix with
``python -m ruff check --fix . && python -m ruff format .``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args", [["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]], ids=["check", "format"]
)
def test_ruff(args):
    r = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
