"""Numerics choices the ops' Triton kernels share, one home each (launchers and TensorRT plugin
kernels both read them)."""

from __future__ import annotations

__all__ = ["dot_input_precision"]


def dot_input_precision(dtype: str) -> str:
    """``tl.dot``'s ``input_precision`` for activations of ``dtype`` ("fp32" | "fp16" | "bf16"):
    "ieee" for fp32 (exact products, no TF32 truncation), "tf32" otherwise (16-bit inputs ignore it)."""
    return "ieee" if dtype == "fp32" else "tf32"
