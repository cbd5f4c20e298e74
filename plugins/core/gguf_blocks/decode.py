"""``decode_blocks``: raw GGUF rows of any supported block type -> :class:`KernelBlocks`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks import kquants, legacy
from trtpipe.plugins.core.gguf_blocks.formats import GGUF_BLOCK_TYPES
from trtpipe.plugins.core.gguf_blocks.kernel_form import KernelBlocks, dequantize_kernel_form

__all__ = ["decode_blocks", "dequantize_blocks"]

_DECODERS: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    "Q4_0": legacy.decode_q4_0,
    "Q4_1": legacy.decode_q4_1,
    "Q5_0": legacy.decode_q5_0,
    "Q5_1": legacy.decode_q5_1,
    "Q8_0": legacy.decode_q8_0,
    "Q4_K": kquants.decode_q4_k,
    "Q5_K": kquants.decode_q5_k,
    "Q6_K": kquants.decode_q6_k,
}


def decode_blocks(raw: np.ndarray, qtype: str) -> KernelBlocks:
    """Decode GGUF rows ``uint8 [N, row_bytes]`` (``WeightTensor.data``) of type ``qtype`` into
    the kernel form: codes int8 ``[N, K]``, scales / offsets float32 ``[N, K/G]`` with
    ``K = row_bytes / block_bytes * block_size`` and G the type's group (16 for Q6_K, else 32).

    Raises :class:`OpError` for a type without a decoder, or bytes that are not whole blocks.
    """
    if qtype not in _DECODERS:
        raise OpError(
            f"qtype = {qtype!r} has no kernel-form decoder; expected one of {', '.join(GGUF_BLOCK_TYPES)}. "
            "Fix: re-quantize the GGUF file with one of those types."
        )
    codes, scales, offsets = _DECODERS[qtype](raw)
    return KernelBlocks(qtype, GGUF_BLOCK_TYPES[qtype].group_size, codes, scales, offsets)


def dequantize_blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    """GGUF rows -> float32 ``[N, K]`` through the kernel form, without the ``gguf`` package
    (bit for bit ``gguf.quants.dequantize``). Raises like :func:`decode_blocks`."""
    return dequantize_kernel_form(decode_blocks(raw, qtype))
