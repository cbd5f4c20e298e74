"""The shared paged KV pool: one K and one V array per layer, owned by the runtime.

Both engines (prefill and decode) bind the same buffers as their ``past_*`` inputs and their
``present_*`` outputs, so the graphs write each new token's K/V in place and nothing copies the
pool (docs/contracts.md). Which blocks belong to which sequence is the KV manager's business
(:mod:`trtpipe.runtime.kv.cache_manager`); this module only holds memory.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np

from trtpipe.runtime.artifact.manifest import KVLayout


def zeros_without_huge_pages(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zero-filled C-contiguous array in anonymous memory advised ``MADV_NOHUGEPAGE`` (Linux).

    The pool is written a block at a time. NumPy advises large arrays to use transparent huge
    pages, so the first write into any 2 MiB region makes the kernel zero and map all of it: with
    the head-major layout a sequence's first block touches one region per kv head, and the first
    request after load faulted in ~2/3 of SmolLM2's 361 MiB pool (+0.4-0.9 s TTFT, +238 MiB RSS,
    measured 2026-12-01). With 4 KiB pages only the blocks written become resident. Falls back to
    ``np.zeros`` where anonymous mmap or the advice is unavailable, and skips the advice where the
    kernel refuses it (no transparent huge pages)."""
    count = math.prod(shape)
    nbytes = count * np.dtype(dtype).itemsize
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is None or not hasattr(mmap, "MAP_ANONYMOUS") or nbytes == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError:  # a kernel without transparent huge pages (EINVAL): nothing to advise against
        pass
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)  # the array keeps buf alive


class KVPool:
    """Per-layer K/V arrays ``[kv_heads_l, num_blocks, block_size, head_dim]`` (zeros at start)."""

    def __init__(self, layout: KVLayout):
        self.layout = layout
        dtype = np.float32 if layout.dtype == "float32" else np.float16
        shapes = [layout.layer_shape(i) for i in range(len(layout.layer_num_kv_heads))]
        self.keys = [zeros_without_huge_pages(shape, dtype) for shape in shapes]
        self.values = [zeros_without_huge_pages(shape, dtype) for shape in shapes]
        self._ort_values: list[tuple[Any, Any]] | None = None  # onnxruntime.OrtValue pairs, made lazily

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy every layer's K and V block ``src`` into ``dst`` for each ``(src, dst)`` pair
        (copy-on-write of a shared block, ``KVCacheManager.take_pending_copies``); one fancy-index
        assignment per array, so it costs ``len(copies)`` blocks per layer, not the pool."""
        if not copies:
            return
        src = np.array([c[0] for c in copies], dtype=np.int64)
        dst = np.array([c[1] for c in copies], dtype=np.int64)
        for arr in (*self.keys, *self.values):  # [kv_heads, num_blocks, block_size, head_dim]
            arr[:, dst] = arr[:, src]

    def ort_values(self):
        """``[(k_0, v_0), ...]`` as ``onnxruntime.OrtValue`` views of the same memory (cached)."""
        if self._ort_values is None:
            import onnxruntime as ort

            self._ort_values = [
                (ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
                for k, v in zip(self.keys, self.values)
            ]
        return self._ort_values
