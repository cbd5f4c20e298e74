"""Ahead-of-time compilation of the ops' Triton kernels (no GPU needed)."""
