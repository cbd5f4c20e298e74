"""Input checks shared by the NumPy references (:mod:`trtpipe.plugins.ops.paged_attention.reference`,
:mod:`trtpipe.plugins.ops.int4_gemm.reference`, :mod:`trtpipe.plugins.core.rope`): each raises :class:`~trtpipe.plugins.core.errors.OpError` naming the
field, the value and what was expected, instead of silently reading the wrong memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtpipe.plugins.core.errors import OpError

__all__ = ["FLOAT_DTYPES", "shape_error", "as_int_array", "as_float_array", "positive_int"]

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what the references accept for float tensors


def shape_error(name: str, got: tuple, expected: str, fix: str = "") -> OpError:
    """``<name>: shape <got>, expected <expected>[; <fix>]`` (returned, for the caller to raise)."""
    msg = f"{name}: shape {tuple(got)}, expected {expected}"
    if fix:
        msg += f"; {fix}"
    return OpError(msg)


def as_int_array(name: str, x: Any, ndim: int) -> np.ndarray:
    """``x`` as an ``ndim``-D int64 array; OpError for a non-integer dtype or another rank."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise OpError(f"{name}: dtype {arr.dtype}, expected an integer dtype (int64 per contract)")
    if arr.ndim != ndim:
        raise shape_error(name, arr.shape, f"a {ndim}-D array")
    return arr.astype(np.int64, copy=False)


def as_float_array(name: str, x: Any) -> np.ndarray:
    """``x`` as an array of float32 or float16 (unchanged); OpError for another dtype."""
    arr = np.asarray(x)
    if arr.dtype not in FLOAT_DTYPES:
        raise OpError(f"{name}: dtype {arr.dtype}, expected float32 or float16")
    return arr


def positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int (bools refused); OpError naming attribute ``name``."""
    if isinstance(value, bool) or int(value) != value or int(value) <= 0:
        raise OpError(f"attribute {name}={value!r}, expected a positive integer")
    return int(value)
