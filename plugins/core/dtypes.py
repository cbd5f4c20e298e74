"""The one dtype table: recipe names, NumPy dtypes, ONNX element types, bytes per element.

Recipes and estimates spell dtypes ``fp32``/``fp16``/``bf16``; manifests and ONNX tensors spell
them as NumPy/ONNX do (``float32``, ``float16``, ``uint8``, ``int64``). ``ONNX`` element types are
the ``onnx.TensorProto`` enum values (from onnx.proto: FLOAT=1, UINT8=2, INT8=3, INT32=6,
INT64=7, FLOAT16=10, BFLOAT16=16), written as ints so the runtime does not import onnx.
NumPy has no bfloat16: its ``numpy`` entry is None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # recipe spelling: "fp32", "fp16", "bf16", "int8", "uint8", "int32", "int64"
    numpy_name: str  # manifest / numpy spelling: "float32", ...; "bfloat16" has no numpy dtype
    onnx_type: int  # onnx.TensorProto enum value
    itemsize: int  # bytes per element

    @property
    def numpy(self) -> np.dtype | None:
        return None if self.name == "bf16" else np.dtype(self.numpy_name)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", "float32", 1, 4),
        DType("fp16", "float16", 10, 2),
        DType("bf16", "bfloat16", 16, 2),
        DType("int8", "int8", 3, 1),
        DType("uint8", "uint8", 2, 1),
        DType("int32", "int32", 6, 4),
        DType("int64", "int64", 7, 8),
    )
}
BY_NUMPY_NAME: dict[str, DType] = {d.numpy_name: d for d in DTYPES.values()}
BY_ONNX_TYPE: dict[int, DType] = {d.onnx_type: d for d in DTYPES.values()}
FLOAT_NAMES: tuple[str, ...] = ("fp32", "fp16", "bf16")


def activation_dtype(precision: str, target_family: str) -> str:
    """The dtype a phase computes in (the one home of this rule): its precision, or for ``int4``
    (weight-only) fp32 on the ``cpu`` target family and fp16 on GPU families."""
    if precision == "int4":
        return "fp32" if target_family == "cpu" else "fp16"
    return precision


def kv_cache_dtype(kv_cache_setting: str | None, decode_precision: str, target_family: str) -> str:
    """The KV pool's dtype: the recipe's ``kv_cache.dtype``, else the decode phase's activation
    dtype (:func:`activation_dtype`)."""
    return kv_cache_setting or activation_dtype(decode_precision, target_family)


def dtype(name: str) -> DType:
    """The record for a recipe name (``fp16``) or a numpy/manifest name (``float16``). Raises
    ValueError naming the value and the accepted names."""
    d = DTYPES.get(name) or BY_NUMPY_NAME.get(name)
    if d is None:
        raise ValueError(f"dtype {name!r}: expected one of {sorted(DTYPES)} or {sorted(BY_NUMPY_NAME)}")
    return d
