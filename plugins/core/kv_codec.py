"""How a KV pool stores K and V per ``kv_cache.dtype``: the one home of the storage rules.

=====  ===================  ========================  =================================================
dtype  pool array (NumPy)   scales beside the pool    one token of one kv head: bytes (``D`` = head_dim)
=====  ===================  ========================  =================================================
fp32   float32              none                      4 D
fp16   float16              none                      2 D (IEEE half, round to nearest even)
bf16   uint16 (bf16 bits)   none                      2 D (top 16 bits of fp32, round to nearest even)
int8   int8                 float32 ``[KVH, NB, BS]``  D + 4 (codes, then one fp32 scale)
=====  ===================  ========================  =================================================

NumPy has no bfloat16, so a bf16 pool holds the bit patterns as uint16 (the runtime needs no
ml_dtypes; ONNX Runtime is handed them typed as BFLOAT16).

int8 is symmetric, one scale per token and kv head (TensorRT-LLM's and vLLM's per-token int8
KV granularity; per-block scales would need the block's future tokens, or a re-quantization of
its past ones, when a token is written): for a row ``x[D]`` (float32)::

    amax  = max_d |x[d]|
    scale = amax / 127                      (float32; 0 when amax == 0)
    q[d]  = clip(rint(x[d] * (127 / amax)), -127, 127)   (127 / amax in float32; q = 0 when amax == 0)
    x'[d] = q[d] * scale                    (what attention reads)

``rint`` rounds half to even; each product and quotient is one float32 rounding, so a kernel
that computes the same float32 operations stores the same codes bit for bit (the C kernels do).
The error bound is ``|x' - x| <= scale / 2 + a few ulp`` per element.

This module imports only NumPy: it is safe on the embedded runtime.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "KV_DTYPES",
    "KV_SCALE_BYTES",
    "kv_storage_dtype",
    "kv_dtype_of_array",
    "kv_has_scales",
    "kv_head_token_bytes",
    "kv_encode",
    "kv_decode",
    "bf16_bits",
    "bf16_to_float32",
]

KV_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")  # recipe spelling, kv_cache.dtype
KV_SCALE_BYTES = 4  # one float32 scale per (token, kv head) of an int8 pool, for K and for V
_STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "int8": np.int8}
_BY_STORAGE = {np.dtype(v).name: k for k, v in _STORAGE.items()}
_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # manifest spelling


def _name(kv_dtype: str) -> str:
    name = _ALIASES.get(kv_dtype, kv_dtype)
    if name not in _STORAGE:
        raise ValueError(f"KV dtype {kv_dtype!r}: expected one of {list(KV_DTYPES)}")
    return name


def kv_storage_dtype(kv_dtype: str) -> np.dtype:
    """The NumPy dtype of a pool array holding ``kv_dtype`` (``fp32`` or ``float32`` spelling).
    Raises ValueError for another name."""
    return np.dtype(_STORAGE[_name(kv_dtype)])


def kv_dtype_of_array(a: np.ndarray) -> str:
    """The KV dtype a pool array holds, from its NumPy dtype (uint16 = bf16 bits; an ml_dtypes
    bfloat16 array is bf16 too). Raises ValueError for another dtype."""
    if a.dtype.name == "bfloat16":
        return "bf16"
    name = _BY_STORAGE.get(a.dtype.name)
    if name is None:
        raise ValueError(f"KV pool dtype {a.dtype}: expected float32, float16, uint16 (bf16 bits) or int8")
    return name


def kv_has_scales(kv_dtype: str) -> bool:
    """True for int8: the pool has float32 scale arrays ``[KVH, NB, BS]`` beside K and V."""
    return _name(kv_dtype) == "int8"


def kv_head_token_bytes(kv_dtype: str, head_dim: int) -> int:
    """Bytes one token's K (or V) takes for one kv head, its scale included (table above)."""
    name = _name(kv_dtype)
    return head_dim * kv_storage_dtype(name).itemsize + (KV_SCALE_BYTES if name == "int8" else 0)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def kv_encode(x: np.ndarray, kv_dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``x [..., D]`` (any float) as the pool stores it: ``(codes [..., D], scale [...] | None)``.
    Codes have :func:`kv_storage_dtype`; ``scale`` (float32) only for int8 (module docstring)."""
    name = _name(kv_dtype)
    x = np.asarray(x, np.float32)
    if name == "bf16":
        return bf16_bits(x), None
    if name != "int8":
        return x.astype(_STORAGE[name]), None
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8)
    return q, (amax / np.float32(127)).astype(np.float32)


def kv_decode(codes: np.ndarray, scale: np.ndarray | None, kv_dtype: str) -> np.ndarray:
    """Pool codes back to float32: the values attention reads (inverse of :func:`kv_encode`
    up to its rounding). ``scale`` ``[...]`` is required for int8 and ignored otherwise."""
    name = _name(kv_dtype)
    if name == "bf16":
        return bf16_to_float32(np.asarray(codes).view(np.uint16))
    if name != "int8":
        return np.asarray(codes).astype(np.float32)
    if scale is None:
        raise ValueError("an int8 KV pool needs its scales (key_scale / value_scale)")
    return np.asarray(codes).astype(np.float32) * np.asarray(scale, np.float32)[..., None]
