"""Rotary position embedding (RoPE) tables as Hugging Face transformers computes them (default,
linear and llama3 rope types), and their application (``rotate_half`` convention).

The reference model and the exported graphs take cos/sin from these tables. Pure NumPy; errors are :class:`~trtpipe.plugins.core.errors.OpError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trtpipe.plugins.core.checks import positive_int
from trtpipe.plugins.core.errors import OpError

__all__ = ["rope_inv_freq", "rope_cos_sin", "check_positions", "apply_rotary"]


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None) -> np.ndarray:
    """Inverse frequencies ``[head_dim/2]`` float64, as Hugging Face transformers defines them.

    ``scaling`` (the ``rope_parameters`` / legacy ``rope_scaling`` dict, ``rope_type`` or legacy
    ``type`` key):
      - None or ``{"rope_type": "default"}``: ``1 / theta**(arange(0, D, 2)/D)``
        (``LlamaRotaryEmbedding.compute_default_rope_parameters``);
      - ``{"rope_type": "linear", "factor": f}``: default / f
        (``_compute_linear_scaling_rope_parameters``);
      - ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings"}``: ``_compute_llama3_parameters``.
    All three have attention_factor 1.0, so cos/sin are not rescaled.

    Raises:
        OpError: odd or non-positive head_dim, theta <= 0, an unknown rope type or a missing key.
    """
    D = positive_int("head_dim", head_dim)
    if D % 2:
        raise OpError(f"head_dim={head_dim}: rotary embedding needs an even head_dim")
    if not float(theta) > 0:
        raise OpError(f"rope theta={theta}: expected a positive float")
    inv_freq = 1.0 / (float(theta) ** (np.arange(0, D, 2, dtype=np.float64) / D))
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))

    def need(k: str) -> float:
        if k not in scaling:
            raise OpError(f"rope scaling {dict(scaling)!r}: rope_type {rope_type!r} needs key {k!r}")
        return float(scaling[k])

    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / need("factor")
    if rope_type == "llama3":
        factor = need("factor")
        low = need("low_freq_factor")
        high = need("high_freq_factor")
        old_ctx = need("original_max_position_embeddings")
        if high == low:
            raise OpError(f"rope scaling {dict(scaling)!r}: high_freq_factor must differ from low_freq_factor")
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, llama)
    raise OpError(f"rope_type {rope_type!r} is not supported; supported: default (None), linear, llama3")


def rope_cos_sin(
    max_positions: int, head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None, dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Rotary tables ``cos, sin`` of shape ``[max_positions, head_dim]`` in ``dtype``.

    Row p holds ``cos(p * inv_freq)`` / ``sin(...)`` laid out as Hugging Face's ``rotate_half``
    expects: ``emb = concat(freqs, freqs)``, so column c uses frequency ``c % (head_dim/2)``.
    Computed in float64 and cast once, so the table is correctly rounded; Hugging Face computes
    ``position * inv_freq`` in float32, which differs by up to ~|p|*6e-8 radians (~5e-4 at
    p = 8192). See :func:`rope_inv_freq` for ``scaling``.

    Raises:
        OpError: max_positions <= 0 and everything :func:`rope_inv_freq` raises.
    """
    P = positive_int("max_positions", max_positions)
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    freqs = np.arange(P, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def check_positions(positions: np.ndarray, table_len: int) -> np.ndarray:
    """Check that positions index a rotary table of ``table_len`` rows; never a silent wrap.

    Returns the positions as int64. Raises OpError naming the first offending entry for a
    non-integer dtype, a negative position, or one >= ``table_len`` (the fix: rebuild with a
    larger ``max_positions`` / context length, or shorten the request).
    """
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        raise OpError(f"positions: dtype {pos.dtype}, expected an integer dtype (int64)")
    pos = pos.astype(np.int64, copy=False)
    bad = np.nonzero((pos < 0) | (pos >= int(table_len)))
    if bad[0].size:
        idx = tuple(int(b[0]) for b in bad)
        where = idx[0] if len(idx) == 1 else idx
        raise OpError(
            f"positions[{where}]={int(pos[idx])} is outside the rotary table [0, {int(table_len)}); "
            "positions must be >= 0 and below the built context length: rebuild with a larger "
            "max_positions or shorten the request"
        )
    return pos


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face ``x*cos + rotate_half(x)*sin`` for ``x [T, heads, D]``, ``cos/sin [T, D]``.

    ``cos``/``sin`` are the table rows at each token's position (``cos_table[positions]``).
    Computed in float32; returns x's dtype.
    """
    x = np.asarray(x)
    if x.ndim != 3 or cos.shape != (x.shape[0], x.shape[2]) or sin.shape != cos.shape:
        raise OpError(
            f"apply_rotary: x {x.shape}, cos {cos.shape}, sin {sin.shape}; expected [T, h, D], [T, D], [T, D]"
        )
    x32 = x.astype(np.float32)
    half = x.shape[-1] // 2
    rot = np.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    c = cos.astype(np.float32)[:, None, :]
    s = sin.astype(np.float32)[:, None, :]
    return (x32 * c + rot * s).astype(x.dtype)
