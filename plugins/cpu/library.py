"""ctypes binding of the host CPU kernels (``csrc/tp.h``): the structs mirrored field by field,
each entry point typed, arrays passed as pointers into NumPy buffers the caller keeps alive.

The library is loaded from a file (an artifact's, or :func:`~.compile.compile_library`'s) once
per path. NumPy-level wrappers (:func:`gemm`, :func:`quant_act`, ...) check shapes and dtypes and
are what the tests call; the engine calls :func:`forward` once per step.
"""

from __future__ import annotations

import ctypes as C
from pathlib import Path

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import kv_dtype_of_array, kv_has_scales
from trtpipe.plugins.cpu.layout import GROUP, TiledWeight

_i8p, _u8p, _u16p = C.POINTER(C.c_int8), C.POINTER(C.c_uint8), C.POINTER(C.c_uint16)
_f32p, _i32p, _i64p = C.POINTER(C.c_float), C.POINTER(C.c_int32), C.POINTER(C.c_int64)


class QAct(C.Structure):
    _fields_ = [
        ("M", C.c_int), ("K", C.c_int), ("levels", C.c_int),
        ("q1", _i8p), ("q2", _i8p), ("s1", _f32p), ("s2", _f32p), ("asum", _f32p),
        ("qsum1", _i32p), ("qsum2", _i32p),
    ]  # fmt: skip


class Weight(C.Structure):
    _fields_ = [("kind", C.c_int), ("N", C.c_int), ("K", C.c_int), ("codes", _u8p), ("d", _u16p), ("m", _u16p)]


class KV(C.Structure):
    _fields_ = [("dtype", C.c_int), ("k", C.c_void_p), ("v", C.c_void_p), ("k_scale", _f32p), ("v_scale", _f32p)]


class Layer(C.Structure):
    _fields_ = [
        ("attn_norm", _f32p), ("mlp_norm", _f32p),
        ("qkv", Weight), ("o", Weight), ("gate_up", Weight), ("down", Weight),
        ("kv", KV),
    ]  # fmt: skip


class Model(C.Structure):
    _fields_ = [
        ("num_layers", C.c_int), ("hidden", C.c_int), ("num_heads", C.c_int), ("num_kv_heads", C.c_int),
        ("head_dim", C.c_int), ("ffn", C.c_int), ("vocab", C.c_int),
        ("num_blocks", C.c_int), ("block_size", C.c_int), ("sliding_window", C.c_int), ("max_positions", C.c_int),
        ("eps", C.c_float), ("scale", C.c_float),
        ("rope_cos", _f32p), ("rope_sin", _f32p),
        ("embed", Weight), ("final_norm", _f32p), ("head", Weight),
        ("layers", C.POINTER(Layer)),
    ]  # fmt: skip


class Step(C.Structure):
    _fields_ = [
        ("T", C.c_int), ("S", C.c_int), ("MB", C.c_int), ("levels", C.c_int),
        ("input_ids", _i64p), ("positions", _i64p), ("slot_mapping", _i64p), ("block_tables", _i64p),
        ("context_lens", _i64p), ("query_start_loc", _i64p), ("last_token_indices", _i64p),
        ("levels_attention", C.c_int), ("levels_mlp", C.c_int), ("levels_head", C.c_int),
    ]  # fmt: skip


FORWARD_ERRORS = {
    -1: "out of memory for the step's scratch buffers",
    -2: "a position is outside the rotary table (max_positions)",
    -3: "a slot or block id is outside the KV pool, or a context is longer than its block table",
    -4: "an input id is outside the vocabulary",
    -5: "a logits row index is outside the step's tokens",
    -6: "an activation level is not 1 or 2",
}
_KINDS = {"q4": 1, "q8": 2}
_KV_DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3}  # tp.h TP_KV_*
_loaded: dict[str, C.CDLL] = {}


def load(path: str | Path) -> C.CDLL:
    """The library at ``path``, typed. Raises :class:`OpError` when it cannot be loaded."""
    key = str(Path(path).resolve())
    if key in _loaded:
        return _loaded[key]
    try:
        lib = C.CDLL(key)
    except OSError as e:
        raise OpError(f"cannot load the host CPU kernels {path}: {e}") from e
    lib.tp_quant_act.argtypes = [_f32p, C.c_int, C.c_int, C.c_int, C.POINTER(QAct)]
    lib.tp_gemm.argtypes = [C.POINTER(Weight), C.POINTER(QAct), _f32p, C.c_int, C.c_int]
    lib.tp_forward.argtypes = [C.POINTER(Model), C.POINTER(Step), _f32p]
    lib.tp_forward.restype = C.c_int
    if hasattr(lib, "tp_forward_rows"):  # absent from libraries built before speculative decoding
        lib.tp_forward_rows.argtypes = [C.POINTER(Model), C.POINTER(Step), C.c_int, _i64p, _f32p]
        lib.tp_forward_rows.restype = C.c_int
    lib.tp_isa.restype = C.c_char_p
    lib.tp_set_threads.argtypes = [C.c_int]
    lib.tp_get_threads.restype = C.c_int
    lib.tp_attention.argtypes = [
        _f32p, C.c_int, C.POINTER(KV), _i64p, C.c_int, _i64p, _i64p,
        C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, C.c_float, C.c_int, _f32p,
    ]  # fmt: skip
    lib.tp_attention.restype = C.c_int  # 0, or -1 out of memory (void in libraries built before 2026-12-06)
    lib.tp_kv_write.argtypes = [
        C.POINTER(KV),
        _f32p,
        _f32p,
        C.c_int,
        _i64p,
        C.c_int,
        C.c_int,
        C.c_int,
        C.c_int,
        C.c_int,
    ]
    lib.tp_rmsnorm.argtypes = [_f32p, _f32p, C.c_float, _f32p, C.c_int, C.c_int]
    lib.tp_silu_mul.argtypes = [_f32p, _f32p, C.c_int, C.c_int]
    lib.tp_rope.argtypes = [_f32p, C.c_int, C.c_int, C.c_int, C.c_int, _i64p, _f32p, _f32p]
    _loaded[key] = lib
    return lib


def ptr(a: np.ndarray, kind):
    """A ctypes pointer to ``a``'s buffer (C-contiguous; the caller keeps ``a`` alive)."""
    if not a.flags.c_contiguous:
        raise OpError("internal: a non-contiguous array was passed to the host CPU kernels")
    return a.ctypes.data_as(kind)


def kv_struct(key_cache: np.ndarray, value_cache: np.ndarray, key_scale=None, value_scale=None) -> KV:
    """The C view of one layer's pool (``[KVH, NB, BS, D]`` arrays of a KV storage dtype,
    :mod:`trtpipe.plugins.core.kv_codec`; int8 with its float32 ``[KVH, NB, BS]`` scales). The
    arrays must outlive the struct. Raises :class:`OpError` for another dtype or missing scales."""
    try:
        name = kv_dtype_of_array(key_cache)
    except ValueError as e:
        raise OpError(f"native engine: {e}") from None
    has_scales = key_scale is not None and value_scale is not None
    if value_cache.dtype != key_cache.dtype or kv_has_scales(name) != has_scales:
        raise OpError(f"native engine: a {name} pool needs {'float32 scales' if kv_has_scales(name) else 'no scales'}")
    for a in (key_cache, value_cache):
        ptr(a, _u8p)  # C-contiguous, or OpError
    scales = (ptr(key_scale, _f32p), ptr(value_scale, _f32p)) if has_scales else (_f32p(), _f32p())
    return KV(_KV_DTYPES[name], key_cache.ctypes.data, value_cache.ctypes.data, *scales)


def weight_struct(w: TiledWeight) -> Weight:
    """The C view of a tiled weight (its arrays must outlive the struct)."""
    m = ptr(w.m.view(np.uint16), _u16p) if w.m is not None else _u16p()  # NULL
    return Weight(_KINDS[w.kind], w.N, w.K, ptr(w.codes, _u8p), ptr(w.d.view(np.uint16), _u16p), m)


class QActBuffers:
    """Scratch for :func:`quant_act` of ``M`` rows of ``K`` values (NumPy-owned)."""

    def __init__(self, M: int, K: int):
        nb = K // GROUP
        self.q1 = np.zeros((M, K), np.int8)
        self.q2 = np.zeros((M, K), np.int8)
        self.s1, self.s2, self.asum = (np.zeros((M, nb), np.float32) for _ in range(3))
        self.qsum1, self.qsum2 = (np.zeros((M, nb), np.int32) for _ in range(2))
        self.struct = QAct(
            M, K, 0, ptr(self.q1, _i8p), ptr(self.q2, _i8p), ptr(self.s1, _f32p), ptr(self.s2, _f32p),
            ptr(self.asum, _f32p), ptr(self.qsum1, _i32p), ptr(self.qsum2, _i32p),
        )  # fmt: skip


def quant_act(lib: C.CDLL, x: np.ndarray, levels: int) -> QActBuffers:
    """``x [M, K]`` float32 quantized per 32-block in ``levels`` (1 or 2) int8 levels."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] % GROUP or levels not in (1, 2):
        raise OpError(f"quant_act: x {x.shape}, levels {levels}: expected [M, K] with K % 32 == 0, levels 1 or 2")
    a = QActBuffers(*x.shape)
    lib.tp_quant_act(ptr(x, _f32p), x.shape[0], x.shape[1], levels, C.byref(a.struct))
    return a


def gemm(lib: C.CDLL, w: TiledWeight, x: np.ndarray, levels: int) -> np.ndarray:
    """``y [M, N] = x @ W^T`` float32 through the kernels, x quantized in ``levels`` levels."""
    if x.shape[-1] != w.K:
        raise OpError(f"gemm: x {x.shape} against a weight of K {w.K}")
    a = quant_act(lib, x, levels)
    y = np.zeros((x.shape[0], w.N), np.float32)
    ws = weight_struct(w)
    lib.tp_gemm(C.byref(ws), C.byref(a.struct), ptr(y, _f32p), w.N, 0)
    return y
