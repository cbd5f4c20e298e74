"""What a build returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.runtime.artifact.manifest import Manifest


@dataclass(frozen=True)
class BuildResult:
    artifact_dir: Path
    skipped: bool  # True: the artifact was up to date (inputs hash unchanged), nothing was built
    seconds: float  # wall time of the whole call
    manifest: Manifest
    timings_s: dict[str, Any]  # seconds per stage (``*_s``) and fusion counts (``fused_*``)
