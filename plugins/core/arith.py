"""Integer arithmetic every layer shares (one home): ceiling division."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints: ``ceil(a / b)``."""
    return -(-a // b)


__all__ = ["cdiv"]
