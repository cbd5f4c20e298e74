"""The shared paged KV pool: one K and one V array per layer, owned by the runtime.

Both engines (prefill and decode) bind the same buffers as their ``past_*`` inputs and their
``present_*`` outputs, so the graphs write each new token's K/V in place and nothing copies the
pool (docs/contracts.md). Which blocks belong to which sequence is the KV manager's business
(:mod:`trtpipe.runtime.kv.cache_manager`); this module only holds memory.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from trtpipe.plugins.core.dtypes import DTYPES, dtype
from trtpipe.plugins.core.kv_codec import kv_has_scales, kv_storage_dtype
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
    """Per-layer K/V arrays ``[kv_heads_l, num_blocks, block_size, head_dim]`` (zeros at start) in
    the layout's KV dtype as :mod:`trtpipe.plugins.core.kv_codec` stores it (bf16 as uint16 bits);
    an int8 pool also holds float32 scales ``[kv_heads_l, num_blocks, block_size]`` per layer
    (``key_scales`` / ``value_scales``; empty lists for a float pool)."""

    def __init__(self, layout: KVLayout):
        self.layout = layout
        self.kv_dtype = _kv_name(layout.dtype)
        dtype = kv_storage_dtype(self.kv_dtype)
        shapes = [layout.layer_shape(i) for i in range(len(layout.layer_num_kv_heads))]
        self.keys = [zeros_without_huge_pages(shape, dtype) for shape in shapes]
        self.values = [zeros_without_huge_pages(shape, dtype) for shape in shapes]
        scaled = kv_has_scales(self.kv_dtype)
        self.key_scales = [zeros_without_huge_pages(s[:3], np.float32) for s in shapes] if scaled else []
        self.value_scales = [zeros_without_huge_pages(s[:3], np.float32) for s in shapes] if scaled else []
        self._ort_values: list[tuple[Any, ...]] | None = None  # onnxruntime.OrtValue tuples, made lazily

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def arrays(self) -> list[np.ndarray]:
        """Every array of the pool: K and V of each layer, then the int8 scales."""
        return [*self.keys, *self.values, *self.key_scales, *self.value_scales]

    @property
    def nbytes(self) -> int:
        """Bytes of K, V and (int8) their scales: what :attr:`KVLayout.pool_bytes` plans."""
        return sum(a.nbytes for a in self.arrays)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy every layer's K and V block ``src`` into ``dst`` for each ``(src, dst)`` pair
        (copy-on-write of a shared block, ``KVCacheManager.take_pending_copies``); one fancy-index
        assignment per array, so it costs ``len(copies)`` blocks per layer, not the pool."""
        if not copies:
            return
        src = np.array([c[0] for c in copies], dtype=np.int64)
        dst = np.array([c[1] for c in copies], dtype=np.int64)
        for arr in self.arrays:  # [kv_heads, num_blocks, block_size(, head_dim)]
            arr[:, dst] = arr[:, src]

    def ort_values(self):
        """Per layer ``(k, v)``, or ``(k, v, k_scale, v_scale)`` for an int8 pool, as
        ``onnxruntime.OrtValue`` views of the same memory (cached); a bf16 pool's uint16 bits are
        typed BFLOAT16."""
        if self._ort_values is None:
            import onnxruntime as ort

            def view(a: np.ndarray):
                if self.kv_dtype == "bf16" and a.dtype == np.uint16:
                    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, DTYPES["bf16"].onnx_type)
                return ort.OrtValue.ortvalue_from_numpy(a)

            n = len(self.keys)
            extra = [self.key_scales, self.value_scales] if self.key_scales else []
            self._ort_values = [tuple(view(arrs[i]) for arrs in (self.keys, self.values, *extra)) for i in range(n)]
        return self._ort_values


def _kv_name(manifest_dtype: str) -> str:
    """``kv_cache.dtype`` spelling of a manifest's KV dtype (``float32`` -> ``fp32``, ``int8``)."""
    return dtype(manifest_dtype).name
