"""The paged KV cache: the pool's arrays, the block pool (free blocks, reference counts), per-sequence block lists, prefix-cache block hashes, block arithmetic."""
