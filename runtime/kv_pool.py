"""The shared paged KV pool: one K and one V array per layer, owned by the runtime.

Both engines (prefill and decode) bind the same buffers as their ``past_*`` inputs and their
``present_*`` outputs, so the graphs write each new token's K/V in place and nothing copies the
pool (docs/contracts.md). Which blocks belong to which sequence is the KV manager's business
(:mod:`trtpipe.runtime.kv_manager`); this module only holds memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtpipe.runtime.manifest import KVLayout


class KVPool:
    """Per-layer K/V arrays ``[kv_heads_l, num_blocks, block_size, head_dim]`` (zeros at start)."""

    def __init__(self, layout: KVLayout):
        self.layout = layout
        dtype = np.float32 if layout.dtype == "float32" else np.float16
        self.keys = [np.zeros(layout.layer_shape(i), dtype) for i in range(len(layout.layer_num_kv_heads))]
        self.values = [np.zeros(layout.layer_shape(i), dtype) for i in range(len(layout.layer_num_kv_heads))]
        self._ort_values: list[tuple[Any, Any]] | None = None  # onnxruntime.OrtValue pairs, made lazily

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def ort_values(self):
        """``[(k_0, v_0), ...]`` as ``onnxruntime.OrtValue`` views of the same memory (cached)."""
        if self._ort_values is None:
            import onnxruntime as ort

            self._ort_values = [
                (ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
                for k, v in zip(self.keys, self.values)
            ]
        return self._ort_values
