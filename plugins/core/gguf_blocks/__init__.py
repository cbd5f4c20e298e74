"""GGUF quantized blocks decoded into one kernel form, bit-exact with gguf-py (NumPy only: this
folder runs where the ``gguf`` package is not installed).

    raw rows uint8 [N, row_bytes] ──decode_blocks(raw, qtype)──► KernelBlocks
        codes int8 [N, K] │ scales float32 [N, K/G] │ offsets float32 [N, K/G]
    w[n, k] = fl32(fl32(scales[n, k//G] * codes[n, k]) + offsets[n, k//G])  == gguf.quants.dequantize

``formats.py``: the type table (block geometry, group, code range, bytes per weight);
``kernel_form.py``: the record and its float32 dequantization; ``legacy.py``: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0 (G = 32); ``kquants.py``: Q4_K, Q5_K (G = 32), Q6_K (G = 16); ``decode.py``: dispatch.
Each decoder's docstring states its formula and why it is exact. Errors are :class:`OpError`.
"""

from trtpipe.plugins.core.gguf_blocks.decode import decode_blocks, dequantize_blocks
from trtpipe.plugins.core.gguf_blocks.formats import FLOAT_BYTES, GGUF_BLOCK_TYPES, GgufBlockType, gguf_nbytes
from trtpipe.plugins.core.gguf_blocks.kernel_form import KernelBlocks, dequantize_kernel_form

__all__ = [
    "FLOAT_BYTES",
    "GGUF_BLOCK_TYPES",
    "GgufBlockType",
    "KernelBlocks",
    "decode_blocks",
    "dequantize_blocks",
    "dequantize_kernel_form",
    "gguf_nbytes",
]
