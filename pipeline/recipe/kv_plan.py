"""How big a recipe's paged KV pool is: bytes per block and the number of blocks.

Block arithmetic (ceil-div, blocks per sequence) lives in :mod:`trtpipe.runtime.kv.planning`;
bytes per element in :mod:`trtpipe.plugins.core.dtypes`. Units: bytes; ``memory_budget_mib`` is MiB (2**20).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtpipe.runtime.artifact.model_config import ModelConfig

if TYPE_CHECKING:
    from trtpipe.pipeline.recipe.schema import Recipe


def kv_block_bytes(recipe: Recipe, config: ModelConfig) -> int:
    """Bytes of one KV block over all layers: ``block_size * kv_bytes_per_token(kv dtype)`` (an int8
    pool's scales included)."""
    return recipe.kv_cache.block_size * config.kv_bytes_per_token(recipe.kv_dtype)


def plan_kv_num_blocks(recipe: Recipe, config: ModelConfig) -> int:
    """Number of KV blocks in the pool, null block 0 included.

    ``kv_cache.num_blocks`` if set; else ``floor(memory_budget_mib * 2**20 / (block_size *
    kv_bytes_per_token))``; else room for ``max_batch_size`` sequences of ``max_seq_len``:
    ``max_batch_size * ceil(max_seq_len / block_size) + 1``.
    """
    kv = recipe.kv_cache
    if kv.num_blocks is not None:
        return kv.num_blocks
    if kv.memory_budget_mib is not None:
        return int(kv.memory_budget_mib * 2**20 // kv_block_bytes(recipe, config))
    return recipe.max_batch_size * recipe.max_blocks_per_seq + 1
