"""The KV cache of a recipe: bytes per token and per sequence, the paged pool and what it holds.

``2 x kv_heads_l x (head_dim x dtype + scale)`` bytes per token and layer (an int8 pool's fp32 scale
per token and kv head: plugins/core/kv_codec.py), a sliding-window layer holding at
most ``window`` tokens; the pool is the recipe's (:func:`~trtpipe.pipeline.recipe.plan_kv_num_blocks`),
block arithmetic from :mod:`trtpipe.runtime.kv.planning` (the KV manager's own rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.estimate.model_counts import kv_bytes_per_sequence
from trtpipe.pipeline.recipe import Recipe, plan_kv_num_blocks
from trtpipe.plugins.core.dtypes import dtype, kv_cache_dtype
from trtpipe.plugins.core.kv_codec import kv_head_token_bytes
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.kv.planning import blocks_per_sequence


@dataclass(frozen=True)
class KVEstimate:
    """KV bytes of a recipe on a target family (exact counts)."""

    dtype: str  # fp32 | fp16 | bf16 | int8
    bytes_per_token: int  # all layers
    bytes_per_token_layers: tuple[int, ...]  # [num_layers]
    bytes_per_sequence: int  # max_seq_len tokens, windows applied
    block_bytes: int  # block_size tokens, all layers
    blocks_per_sequence: int  # a max_seq_len sequence in the pool (window releases applied)
    pool_num_blocks: int  # null block included
    pool_bytes: int
    pool_max_sequences: int  # full-length sequences the recipe's pool holds

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one element (an int8 pool's scales not included)."""
        return dtype(self.dtype).itemsize

    def to_dict(self) -> dict[str, Any]:
        """The flat ``kv_*`` keys of ``trtpipe estimate --json``."""
        return {
            "kv_dtype": self.dtype,
            "kv_bytes_per_token": self.bytes_per_token,
            "kv_bytes_per_token_layers": list(self.bytes_per_token_layers),
            "kv_bytes_per_sequence": self.bytes_per_sequence,
            "kv_block_bytes": self.block_bytes,
            "kv_blocks_per_sequence": self.blocks_per_sequence,
            "kv_pool_num_blocks": self.pool_num_blocks,
            "kv_pool_bytes": self.pool_bytes,
            "kv_pool_max_sequences": self.pool_max_sequences,
        }


def kv_estimate(recipe: Recipe, config: ModelConfig, family: str) -> KVEstimate:
    """The KV cache of ``recipe`` for the model facts ``config`` (windows already applied) on
    ``family``: ``kv_cache.dtype``, or the decode phase's activation dtype."""
    kv_dtype = kv_cache_dtype(recipe.kv_cache.dtype, recipe.precision.decode, family)
    row = kv_head_token_bytes(kv_dtype, config.head_dim)
    block_size = recipe.kv_cache.block_size
    block_bytes = block_size * config.kv_bytes_per_token(kv_dtype)
    per_seq = blocks_per_sequence(recipe.max_seq_len, block_size, config.layer_sliding_window)
    num_blocks = plan_kv_num_blocks(recipe, config)
    return KVEstimate(
        dtype=kv_dtype,
        bytes_per_token=config.kv_bytes_per_token(kv_dtype),
        bytes_per_token_layers=tuple(2 * h * row for h in config.layer_num_kv_heads),
        bytes_per_sequence=kv_bytes_per_sequence(config, recipe.max_seq_len, kv_dtype),
        block_bytes=block_bytes,
        blocks_per_sequence=per_seq,
        pool_num_blocks=num_blocks,
        pool_bytes=num_blocks * block_bytes,
        pool_max_sequences=max(0, num_blocks - 1) // per_seq,
    )
