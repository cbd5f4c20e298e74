"""ctypes binding of the host CPU kernels (``csrc/tp.h``): the structs and entry points read from
the header (:mod:`.abi`), the library's ABI checked at load, arrays passed as pointers into NumPy
buffers the caller keeps alive.

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
from trtpipe.plugins.cpu.abi import abi, bind, check_library
from trtpipe.plugins.cpu.layout import GROUP, Tiled, TiledI8

_i8p, _u8p, _u16p, _i16p = C.POINTER(C.c_int8), C.POINTER(C.c_uint8), C.POINTER(C.c_uint16), C.POINTER(C.c_int16)
_f32p, _i32p, _i64p = C.POINTER(C.c_float), C.POINTER(C.c_int32), C.POINTER(C.c_int64)


_ABI = abi()
QAct, Weight, KV = _ABI.structs["tp_qact"], _ABI.structs["tp_weight"], _ABI.structs["tp_kv"]
Layer, Model, Step = _ABI.structs["tp_layer"], _ABI.structs["tp_model"], _ABI.structs["tp_step"]
_C = _ABI.constants

# what each TP_E_* code of tp_forward means, for the engine's error
FORWARD_ERRORS = {
    _C["TP_E_NOMEM"]: "out of memory for the step's scratch buffers",
    _C["TP_E_POSITION"]: "a position is outside the rotary table (max_positions)",
    _C["TP_E_POOL"]: "a slot or block id is outside the KV pool, or a context is longer than its block table",
    _C["TP_E_VOCAB"]: "an input id is outside the vocabulary",
    _C["TP_E_LOGIT_ROW"]: "a logits row index is outside the step's tokens",
    _C["TP_E_LEVELS"]: "an activation level is not 1 or 2",
    _C["TP_E_SHAPE"]: "the step's token, sequence or block-table counts are out of range",
    _C["TP_E_QUERY_LOC"]: "query_start_loc is not 0 = q[0] < q[1] < ... < q[S] = T",
    _C["TP_E_CONTEXT"]: "a context length is shorter than its query tokens or past max_positions",
}
NOMEM = _C["TP_E_NOMEM"]
_KINDS = {"q4": _C["TP_W_Q4"], "q8": _C["TP_W_Q8"], "i8": _C["TP_W_I8"]}
_KV_DTYPES = {"fp32": _C["TP_KV_F32"], "fp16": _C["TP_KV_F16"], "bf16": _C["TP_KV_BF16"], "int8": _C["TP_KV_I8"]}
_loaded: dict[str, C.CDLL] = {}


def load(path: str | Path, *, check: bool = True) -> C.CDLL:
    """The library at ``path``, typed from tp.h (:mod:`.abi`). Raises :class:`OpError` when it
    cannot be loaded or (``check``) its ABI is not tp.h's: an artifact's library from another
    trtpipe. ``check=False`` is for bench A/B runs of older kernel sources through the entry
    points whose signatures did not change (tp_gemm, tp_quant_act)."""
    key = str(Path(path).resolve())
    if key in _loaded:
        return _loaded[key]
    try:
        lib = C.CDLL(key)
    except OSError as e:
        raise OpError(f"cannot load the host CPU kernels {path}: {e}") from e
    if check:
        check_library(lib, path)
    bind(lib)
    _loaded[key] = lib
    return lib


def ptr(a: np.ndarray, kind):
    """A ctypes pointer to ``a``'s buffer (C-contiguous; the caller keeps ``a`` alive)."""
    if not a.flags.c_contiguous:
        raise OpError("internal: a non-contiguous array was passed to the host CPU kernels")
    return a.ctypes.data_as(kind)


def kv_struct(key_cache: np.ndarray, value_cache: np.ndarray, key_scale=None, value_scale=None) -> C.Structure:
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


def weight_struct(w: Tiled) -> C.Structure:
    """The C view of a tiled weight (its arrays must outlive the struct): Q4 / Q8 with ``d``
    (and ``m``), I8 with ``group``, ``scale`` and ``offset`` (NULL when symmetric)."""
    if isinstance(w, TiledI8):
        offset = ptr(w.offset, _f32p) if w.offset is not None else _f32p()  # NULL: symmetric
        return Weight(
            kind=_KINDS["i8"], N=w.N, K=w.K, codes=ptr(w.codes, _u8p), group=w.group, scale=ptr(w.scale, _f32p),
            offset=offset,
        )  # fmt: skip
    m = ptr(w.m.view(np.uint16), _u16p) if w.m is not None else _u16p()  # NULL
    return Weight(_KINDS[w.kind], w.N, w.K, ptr(w.codes, _u8p), ptr(w.d.view(np.uint16), _u16p), m)


class QActBuffers:
    """Scratch for :func:`quant_act` of ``M`` rows of ``K`` values (NumPy-owned); ``q16`` holds
    the int16 form's codes with each 4-group of k as (0, 2, 1, 3) (tp.h; :func:`int16_codes`)."""

    def __init__(self, M: int, K: int):
        nb = K // GROUP
        self.q1 = np.zeros((M, K), np.int8)
        self.q2 = np.zeros((M, K), np.int8)
        self.s1, self.s2, self.asum = (np.zeros((M, nb), np.float32) for _ in range(3))
        self.qsum1, self.qsum2 = (np.zeros((M, nb), np.int32) for _ in range(2))
        self.qhalf1, self.qhalf2 = (np.zeros((M, 2 * nb), np.int32) for _ in range(2))  # per-16 sums
        self.q16 = np.zeros((M, K), np.int16)
        self.struct = QAct(
            M, K, 0, ptr(self.q1, _i8p), ptr(self.q2, _i8p), ptr(self.s1, _f32p), ptr(self.s2, _f32p),
            ptr(self.asum, _f32p), ptr(self.qsum1, _i32p), ptr(self.qsum2, _i32p), ptr(self.qhalf1, _i32p),
            ptr(self.qhalf2, _i32p), ptr(self.q16, _i16p),
        )  # fmt: skip


def act_form(lib: C.CDLL) -> str:
    """How ``lib`` holds ``levels: 2``: "int8x2" or "int16" (tp.h, :data:`.isa.ACT_FORM`)."""
    return lib.tp_act_form().decode()


def int16_codes(a: QActBuffers) -> np.ndarray:
    """The int16 form's codes ``[M, K]`` int16 in k order (q16's 4-groups (0, 2, 1, 3) undone)."""
    M, K = a.q16.shape
    return a.q16.reshape(M, K // 4, 4)[:, :, [0, 2, 1, 3]].reshape(M, K)


def quant_act(lib: C.CDLL, x: np.ndarray, levels: int, *, halves: bool = False) -> QActBuffers:
    """``x [M, K]`` float32 quantized per 32-block in ``levels`` (1 or 2) int8 levels; ``halves``:
    also the per-16 code sums ``qhalf1`` (``qhalf2``) ``[M, K/16]`` (tp_quant_act_halves)."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] % GROUP or levels not in (1, 2):
        raise OpError(f"quant_act: x {x.shape}, levels {levels}: expected [M, K] with K % 32 == 0, levels 1 or 2")
    a = QActBuffers(*x.shape)
    quant = lib.tp_quant_act_halves if halves else lib.tp_quant_act
    quant(ptr(x, _f32p), x.shape[0], x.shape[1], levels, C.byref(a.struct))
    return a


def gemm(lib: C.CDLL, w: Tiled, x: np.ndarray, levels: int) -> np.ndarray:
    """``y [M, N] = x @ W^T`` float32 through the kernels, x quantized in ``levels`` levels (with
    the per-16 sums for an I8 weight of group 16)."""
    if x.shape[-1] != w.K:
        raise OpError(f"gemm: x {x.shape} against a weight of K {w.K}")
    a = quant_act(lib, x, levels, halves=isinstance(w, TiledI8) and w.group == 16)
    y = np.zeros((x.shape[0], w.N), np.float32)
    ws = weight_struct(w)
    lib.tp_gemm(C.byref(ws), C.byref(a.struct), ptr(y, _f32p), w.N, 0)
    return y
