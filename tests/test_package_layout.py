"""Every Python package folder of the tree is listed in pyproject.toml's ``[tool.setuptools]
packages`` (the list is explicit because of the ``trtpipe.*`` package-dir mapping): a folder
missing there installs fine in editable mode but is absent from the wheel that a Jetson gets."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_in_the_wheel():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {name: ROOT / path for name, path in cfg["package-dir"].items()}
    found = set()
    for top, path in dirs.items():
        for init in path.rglob("__init__.py"):
            rel = init.parent.relative_to(path)
            found.add(".".join((top, *rel.parts)) if rel.parts else top)
    assert found - listed == set(), f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but no such package folder: {sorted(listed - found)}"
