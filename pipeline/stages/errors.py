"""The build's exceptions (one family: :class:`~trtpipe.plugins.core.errors.TrtpipeError`)."""

from __future__ import annotations

from pathlib import Path

from trtpipe.plugins.core.errors import TrtpipeError


class BuildError(TrtpipeError):
    """The build could not finish (the previous artifact, if any, is left intact)."""


class BuildNeedsTarget(BuildError):
    """The spec is written but this machine cannot build the plans (no TensorRT or no matching
    GPU). The message names what is missing and the command that finishes on the target."""

    def __init__(self, message: str, spec_path: Path):
        super().__init__(message)
        self.spec_path = spec_path
