"""Model facts -> counts: parameters, FLOP per step, KV bytes per sequence.

Exact integer counts from a :class:`~trtpipe.runtime.artifact.model_config.ModelConfig` (no weights read).
Layers may differ in KV heads and sliding window; a window of 0 means full attention. The KV byte
count has its home in :mod:`trtpipe.runtime.metrics.decode_bandwidth` (the runtime reports achieved
bandwidth with it); the functions here apply it to a whole model.
"""

from __future__ import annotations

from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.metrics import decode_bandwidth


def linear_params(config: ModelConfig) -> int:
    """Weights of every GEMM except lm_head, over all layers (layers may differ in kv heads)."""
    h, d = config.hidden_size, config.head_dim
    per_layer_fixed = 2 * h * config.num_heads * d + 3 * h * config.intermediate_size
    return sum(per_layer_fixed + 2 * h * kvh * d for kvh in config.layer_num_kv_heads)


def bias_params(config: ModelConfig) -> int:
    """q/k/v biases (Qwen2) over all layers; 0 without ``attention_bias``."""
    if not config.attention_bias:
        return 0
    d = config.head_dim
    return sum((config.num_heads + 2 * kvh) * d for kvh in config.layer_num_kv_heads)


def norm_params(config: ModelConfig) -> int:
    """RMSNorm weights: two per layer and the final one."""
    return (2 * config.num_layers + 1) * config.hidden_size


def total_params(config: ModelConfig) -> int:
    """Every parameter: embedding, lm_head unless tied, GEMMs, biases, norms."""
    emb = config.vocab_size * config.hidden_size
    lm_head = 0 if config.tie_word_embeddings else emb
    return emb + lm_head + linear_params(config) + bias_params(config) + norm_params(config)


def kv_bytes_per_layer(config: ModelConfig, num_tokens: int, kv_dtype: str) -> tuple[int, ...]:
    """K and V bytes of each layer for a sequence of ``num_tokens`` tokens:
    ``2 x kv_heads_l x row_bytes x min(num_tokens, window_l)`` (window 0 = none; ``row_bytes``: one
    token of one kv head in ``kv_dtype``, int8 scales included)."""
    return decode_bandwidth.kv_bytes_per_layer(
        config.layer_num_kv_heads, config.layer_sliding_window, config.head_dim, num_tokens, kv_dtype
    )


def kv_bytes_per_sequence(config: ModelConfig, num_tokens: int, kv_dtype: str) -> int:
    """KV bytes of one sequence of ``num_tokens`` tokens, all layers (windows applied)."""
    return sum(kv_bytes_per_layer(config, num_tokens, kv_dtype))


def _attended_keys(num_tokens: int, window: int) -> int:
    """Sum over a causal prefill of n tokens of the keys each query sees: sum_i min(i, W)."""
    n = num_tokens
    if window <= 0 or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def prefill_flops(config: ModelConfig, num_tokens: int) -> int:
    """FLOP of prefilling one sequence of ``num_tokens`` tokens from position 0:
    ``2 x linear_params x n`` (GEMMs) + ``4 x heads x head_dim x sum_i min(i, W)`` per layer
    (QK^T and PV, causal) + ``2 x hidden x vocab`` (logits of the last token only)."""
    gemm = 2 * linear_params(config) * num_tokens
    attn = sum(
        4 * config.num_heads * config.head_dim * _attended_keys(num_tokens, w) for w in config.layer_sliding_window
    )
    return gemm + attn + 2 * config.hidden_size * config.vocab_size


def decode_flops(config: ModelConfig, context_tokens: int) -> int:
    """FLOP of one decode token at ``context_tokens`` tokens of context (itself included)."""
    attn = sum(
        4 * config.num_heads * config.head_dim * (min(context_tokens, w) if w > 0 else context_tokens)
        for w in config.layer_sliding_window
    )
    return 2 * linear_params(config) + attn + 2 * config.hidden_size * config.vocab_size
