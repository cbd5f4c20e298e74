"""KV-cache block arithmetic, one home for the build side (recipe checks, estimates, golden
runs) and the runtime (KV manager, step-cost calibration).

A sequence of ``n`` tokens holds ``ceil(n / block_size)`` blocks. With one sliding window ``W``
for every layer the KV manager frees blocks that left the window, so a sequence holds at most
``ceil(W / block_size) + 1`` blocks in steady decode (the +1: the window straddles a block
boundary). Source: vLLM v1 ``SlidingWindowManager`` (same rule).
"""

from __future__ import annotations

from collections.abc import Sequence

from trtpipe.plugins.core.arith import cdiv  # noqa: F401  (the home of ceil-div; re-used here)


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens of one sequence (full attention)."""
    return cdiv(num_tokens, block_size)


def blocks_per_sequence(max_seq_len: int, block_size: int, layer_sliding_window: Sequence[int] = ()) -> int:
    """Blocks a full-length sequence holds in steady decode. ``layer_sliding_window``: one window
    per layer, 0 = full attention; the window rule applies only when every layer has the same
    window W > 0 (a mixed model keeps full-length blocks for its full-attention layers)."""
    full = cdiv(max_seq_len, block_size)
    windows = set(layer_sliding_window)
    if len(windows) == 1 and (w := next(iter(windows))) > 0:
        return min(full, cdiv(w, block_size) + 1)
    return full
