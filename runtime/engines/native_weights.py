"""``native.bin``: the native engine's weights, one read-only memory map, every tensor 64-byte
aligned at the offset the manifest's ``runtime_options.native.tensors`` records as
``{name: [numpy dtype, [size], offset_bytes]}`` (written by ``pipeline/stages/native.py``)."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtpipe.runtime.errors import ArtifactError

WEIGHTS_FILE = "native.bin"
ALIGN = 64


class NativeWeights:
    """The tensors of ``native.bin`` as NumPy views of one memory map (``tensor(name)``)."""

    def __init__(self, path: Path, table: Mapping[str, Any], rebuild: str):
        with open(path, "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._data = np.frombuffer(self._mmap, dtype=np.uint8)
        self._table = table
        self._rebuild = rebuild
        self.nbytes = len(self._mmap)

    def tensor(self, name: str, count: int | None = None, facts: str = "") -> np.ndarray:
        """The flat array ``name`` (of ``count`` elements when given: what the manifest's model
        ``facts`` make of it). Raises :class:`ArtifactError` when it is not in the table, falls
        outside the file, or holds another count (a manifest that disagrees with its weights
        would have the kernels read past them)."""
        a = self._tensor(name)
        if count is not None and a.size != count:
            raise ArtifactError(
                f"{WEIGHTS_FILE}: tensor {name!r} holds {a.size} values; the manifest's model facts ({facts}) "
                f"need {count}: the manifest and the weights disagree. Fix: `{self._rebuild}`."
            )
        return a

    def _tensor(self, name: str) -> np.ndarray:
        try:
            dtype, (size,), offset = self._table[name]
            dt = np.dtype(dtype)
            if offset % ALIGN or offset + int(size) * dt.itemsize > self.nbytes:
                raise ValueError(name)
            return np.frombuffer(self._data, dtype=dt, count=int(size), offset=int(offset))
        except (KeyError, ValueError, TypeError) as e:
            raise ArtifactError(
                f"{WEIGHTS_FILE}: tensor {name!r} is missing or outside the file ({e!r}). Fix: `{self._rebuild}`."
            ) from e

    def has(self, name: str) -> bool:
        return name in self._table
