"""What every custom op shares: the exception family, the dtype table, the references' input checks,
versions, RoPE tables, GGUF block decoding (gguf_blocks/)."""
