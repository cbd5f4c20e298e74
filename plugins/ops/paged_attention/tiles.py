"""Tiles of ``trtpipe::PagedAttention``'s Triton kernels, chosen on the host: the constexprs both
attention kernels share and the block sizes of each, picked the same way by the launchers
(:mod:`trtpipe.plugins.ops.paged_attention.triton_launch`) and the TensorRT plugin kernels
(:mod:`trtpipe.plugins.ops.paged_attention.trt_kernels`). Pure Python (no triton import). A
plugin ABI source (:data:`trtpipe.plugins.ops.abi.PLUGIN_ABI_SOURCES`).
"""

from __future__ import annotations

__all__ = ["next_pow2", "attention_tiles", "decode_block_n", "prefill_block_q"]


def next_pow2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for x <= 1): Triton block shapes must be powers of two."""
    return 1 << max(0, int(x) - 1).bit_length()


def attention_tiles(num_heads: int, num_kv_heads: int, head_size: int, block_size: int) -> dict[str, int]:
    """The constexprs both attention kernels share: ``NUM_KV_HEADS``, ``HEAD_SIZE``, ``BLOCK_SIZE``,
    ``GROUP`` (query heads per kv head), ``GROUP_PAD`` and ``D_PAD`` (powers of two, ``D_PAD >= 16``)."""
    group = num_heads // num_kv_heads
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=next_pow2(group),
        D_PAD=max(16, next_pow2(head_size)),
    )


def decode_block_n(tiles: dict[str, int]) -> int:
    """Keys per iteration of the decode kernel: ~8192 elements of the ``[GROUP_PAD, BLOCK_N, D_PAD]``
    product per step, 16..64."""
    return max(16, min(64, next_pow2(max(1, 8192 // (tiles["GROUP_PAD"] * tiles["D_PAD"])))))


def prefill_block_q(tiles: dict[str, int]) -> int:
    """Query tokens per prefill tile: 64 rows of ``BLOCK_Q x GROUP_PAD``."""
    return max(1, 64 // tiles["GROUP_PAD"])
