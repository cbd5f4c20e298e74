"""Tile-interleaved weight layouts of the host CPU kernels (``csrc/tp.h``), built from blockwise
codes in NumPy. Exact: codes are moved, never requantized; Q4 / Q8 scales and minimums are stored
fp16, which holds GGUF Q4_1 / Q8_0 fields (fp16 in the file) without rounding; I8 (GGUF's kernel
form, :mod:`trtpipe.plugins.core.gguf_blocks`, every block type) keeps its float32 scales and offsets.

    Q4  codes [N/16][K/8][16][4] uint8   byte i of row r, k-group g: q[r, 8g+i] | q[r, 8g+4+i] << 4
        d, m  [N/16][K/32][16] fp16      w[n, k] = d[n, k // 32] * q[n, k] + m[n, k // 32]
    Q8  codes [N/16][K/4][16][4] uint8   u[r, 4j+i]
        d     [N/16][K/32][16] fp16      w[n, k] = d[n, k // 32] * (u[n, k] - 128)
    I8  codes [N/16][K/4][16][4] uint8   u = c + 128 (as Q8)
        scale, offset [N/16][K/G][16] fp32   w[n, k] = (scale[n, g] * c[n, k]) + offset[n, g], g = k // G
                                         G = 32 or 16; offset None when every one is -0.0 (symmetric)

Fused linears (:func:`concat_rows`) of mixed kinds become I8 when that is exact (Q8 as I8 with
offset -0.0, Q4 with offset m, a symmetric G = 32 weight as G = 16 with each scale repeated);
anything else (an offset weight beside a G = 16 one) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.gguf_blocks import KernelBlocks

GROUP = 32
TILE = 16
NEG_ZERO_BITS = 0x80000000  # float32 -0.0: the offset of a symmetric type


@dataclass(frozen=True)
class TiledWeight:
    """One linear in a kernel layout: ``kind`` "q4" | "q8", ``codes`` uint8 (flat), ``d`` and
    ``m`` (q4 only, else None) float16 (flat), ``N`` output rows, ``K`` inputs."""

    kind: str
    N: int
    K: int
    codes: np.ndarray
    d: np.ndarray
    m: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.d.nbytes + (self.m.nbytes if self.m is not None else 0)


def _check(name: str, codes: np.ndarray, top: int) -> tuple[int, int]:
    if codes.ndim != 2 or codes.dtype != np.uint8:
        raise OpError(f"{name}: codes {codes.dtype} {codes.shape}, expected uint8 [N, K]")
    N, K = codes.shape
    if N % TILE or K % GROUP:
        raise OpError(
            f"{name}: shape [N, K] = [{N}, {K}]: the host CPU kernels need N % {TILE} == 0 and K % {GROUP} == 0. "
            "Fix: set engine.cpu_backend: ort for this model."
        )
    if int(codes.max(initial=0)) > top:
        raise OpError(f"{name}: a code is {int(codes.max())}, expected 0..{top}")
    return N, K


def _blocks_fp16(name: str, values: np.ndarray, N: int, K: int) -> np.ndarray:
    v = np.asarray(values, np.float32)
    if v.shape != (N, K // GROUP):
        raise OpError(f"{name}: shape {v.shape}, expected [N, K/32] = [{N}, {K // GROUP}]")
    h = v.astype(np.float16)
    if not np.array_equal(h.astype(np.float32), v):
        raise OpError(f"{name}: a value is not exact in fp16; the host CPU layout stores scales as fp16")
    return np.ascontiguousarray(h.reshape(N // TILE, TILE, K // GROUP).transpose(0, 2, 1)).reshape(-1)


def tile_q4(codes: np.ndarray, d: np.ndarray, m: np.ndarray, name: str = "weight") -> TiledWeight:
    """Q4 layout from codes ``[N, K]`` uint8 (0..15), ``d`` and ``m`` ``[N, K/32]`` (fp16-exact).
    Raises :class:`OpError` for a shape the kernels cannot take or a value not exact in fp16."""
    N, K = _check(name, codes, 15)
    c = codes.reshape(N // TILE, TILE, K // 8, 2, 4)  # [tile, r, g, half, i]
    packed = c[:, :, :, 0, :] | (c[:, :, :, 1, :] << 4)  # [tile, r, g, i]
    out = np.ascontiguousarray(packed.transpose(0, 2, 1, 3)).reshape(-1)  # [tile, g, r, i]
    return TiledWeight(
        "q4", N, K, out, _blocks_fp16(f"{name} scales", d, N, K), _blocks_fp16(f"{name} minimums", m, N, K)
    )


def tile_q8(codes: np.ndarray, d: np.ndarray, name: str = "weight") -> TiledWeight:
    """Q8 layout from codes ``[N, K]`` uint8 (``u = q + 128``) and ``d`` ``[N, K/32]``."""
    N, K = _check(name, codes, 255)
    c = codes.reshape(N // TILE, TILE, K // 4, 4)
    out = np.ascontiguousarray(c.transpose(0, 2, 1, 3)).reshape(-1)
    return TiledWeight("q8", N, K, out, _blocks_fp16(f"{name} scales", d, N, K), None)


@dataclass(frozen=True)
class TiledI8:
    """One linear in the I8 layout (tp.h): ``codes`` uint8 ``u = c + 128`` (flat, as Q8),
    ``scale`` float32 ``[N/16][K/G][16]`` (flat), ``offset`` the same or None (symmetric: every
    offset -0.0, the kernel skips the ``o * asum`` term), ``group`` G (32 or 16), ``qtype`` the
    GGUF type(s) it came from (for messages)."""

    N: int
    K: int
    group: int
    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None
    qtype: str = "I8"

    kind = "i8"

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + (self.offset.nbytes if self.offset is not None else 0)


Tiled = TiledWeight | TiledI8


def _tile_groups(v: np.ndarray, N: int, groups: int) -> np.ndarray:
    """``[N, groups]`` float32 -> flat ``[N/16][groups][16]``."""
    return np.ascontiguousarray(v.reshape(N // TILE, TILE, groups).transpose(0, 2, 1)).reshape(-1)


def _untile_groups(v: np.ndarray, N: int, groups: int) -> np.ndarray:
    """The inverse of :func:`_tile_groups`: flat -> ``[N, groups]``."""
    return v.reshape(N // TILE, groups, TILE).transpose(0, 2, 1).reshape(N, groups)


def _tile_codes8(u: np.ndarray) -> np.ndarray:
    N, K = u.shape
    return np.ascontiguousarray(u.reshape(N // TILE, TILE, K // 4, 4).transpose(0, 2, 1, 3)).reshape(-1)


def tile_i8(kb: KernelBlocks, name: str = "weight") -> TiledI8:
    """I8 layout of GGUF's kernel form (:class:`~trtpipe.plugins.core.gguf_blocks.KernelBlocks`):
    codes int8 ``[N, K]`` stored ``+ 128``, float32 scales / offsets ``[N, K/G]`` tiled; offsets
    dropped (None) when every one is -0.0. Exact: :func:`dequantize` equals
    ``gguf_blocks.dequantize_kernel_form(kb)`` bit for bit. Raises :class:`OpError` for a shape
    the kernels cannot take (N % 16, K % 32), a group other than 32 or 16, or G = 16 with an
    offset that is not -0.0 (the kernels hold no per-16 activation sums)."""
    codes, G = np.asarray(kb.codes), int(kb.group_size)
    if codes.ndim != 2 or codes.dtype != np.int8:
        raise OpError(f"{name}: codes {codes.dtype} {codes.shape}, expected int8 [N, K] (KernelBlocks.codes)")
    N, K = _check(name, codes.view(np.uint8), 255)
    if G not in (16, 32):
        raise OpError(f"{name} ({kb.qtype}): group_size = {G}, expected 32 or 16. Fix: decode with gguf_blocks.")
    scales, offsets = (np.asarray(v, np.float32) for v in (kb.scales, kb.offsets))
    if scales.shape != (N, K // G) or offsets.shape != (N, K // G):
        raise OpError(f"{name}: scales {scales.shape}, offsets {offsets.shape}, expected [N, K/G] = [{N}, {K // G}]")
    symmetric = bool(np.all(offsets.view(np.uint32) == NEG_ZERO_BITS))
    if G == 16 and not symmetric:
        raise OpError(
            f"{name} ({kb.qtype}): group 16 with offsets other than -0.0; the host CPU kernels take offsets "
            "with group 32 only. Fix: set engine.cpu_backend: ort for this model."
        )
    u = (codes.astype(np.int16) + 128).astype(np.uint8)
    offset = None if symmetric else _tile_groups(offsets, N, K // G)
    return TiledI8(N, K, G, _tile_codes8(u), _tile_groups(scales, N, K // G), offset, kb.qtype)


def to_i8(w: Tiled, group: int = GROUP) -> TiledI8:
    """``w`` as an I8 weight of ``group`` with the same :func:`dequantize`, bit for bit: Q8 as
    scale d (fp16 widened, exact), offset -0.0; Q4 as codes q, scale d, offset m (the same two
    float32 roundings ``d * q + m``); a symmetric G = 32 I8 as G = 16 with each scale repeated.
    Raises :class:`OpError` where no exact form exists (an offset weight at G = 16)."""
    if isinstance(w, TiledI8) and w.group == group:
        return w
    N, K = w.N, w.K
    if isinstance(w, TiledI8):
        if group != 16 or w.offset is not None:
            raise OpError(f"{w.qtype} weight (group {w.group}, offsets {w.offset is not None}) as group {group}")
        s = np.repeat(w.scale.reshape(N // TILE, K // GROUP, 1, TILE), 2, axis=2).reshape(-1)
        return TiledI8(N, K, 16, w.codes, s, None, w.qtype)
    if w.kind == "q4" and group == 16:
        raise OpError("a Q4 weight (offsets m) has no exact group-16 form")
    if w.kind == "q4":
        p = w.codes.reshape(N // TILE, K // 8, TILE, 4).transpose(0, 2, 1, 3)  # [tile, r, g, i]
        q = np.stack([p & 15, p >> 4], axis=3).reshape(N, K)
        codes = _tile_codes8((q + 128).astype(np.uint8))
    else:
        codes = w.codes
    offset = w.m.astype(np.float32) if w.m is not None else None
    i8 = TiledI8(N, K, GROUP, codes, w.d.astype(np.float32), offset, w.kind.upper())
    return to_i8(i8, group)


def _concat_i8(name: str, parts: list[TiledI8]) -> TiledI8:
    if any(p.group == 16 for p in parts) and any(p.offset is not None for p in parts):
        raise OpError(
            f"{name}: cannot fuse {[p.qtype for p in parts]}: a group-16 weight (offsets -0.0) beside one with "
            "offsets has no common exact layout. Fix: keep these linears as separate GEMMs."
        )
    G = min(p.group for p in parts)
    parts = [to_i8(p, G) for p in parts]
    neg_zero = np.uint32(NEG_ZERO_BITS).view(np.float32)
    offset = None
    if any(p.offset is not None for p in parts):
        offset = np.concatenate([p.offset if p.offset is not None else np.full_like(p.scale, neg_zero) for p in parts])
    return TiledI8(
        sum(p.N for p in parts),
        parts[0].K,
        G,
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.scale for p in parts]),
        offset,
        "+".join(dict.fromkeys(p.qtype for p in parts)),
    )


def concat_rows(name: str, parts: list[Tiled]) -> Tiled:
    """Weights stacked along N (fused QKV, gate/up): tiles concatenate, since each tile is whole.
    Parts of one Q4 / Q8 kind stay that kind; any other mix becomes I8 (:func:`to_i8`, exact).
    Raises :class:`OpError` for parts of different K, or a mix with no exact common layout."""
    kinds = {p.kind for p in parts}
    Ks = {p.K for p in parts}
    if len(Ks) != 1:
        raise OpError(f"{name}: cannot fuse linears of K {sorted(Ks)}. Fix: fuse only linears of one input.")
    if len(kinds) != 1 or "i8" in kinds:
        return _concat_i8(name, [to_i8(p) if isinstance(p, TiledWeight) else p for p in parts])
    qparts = [p for p in parts if isinstance(p, TiledWeight)]
    kind, K = kinds.pop(), Ks.pop()
    m = np.concatenate([p.m for p in qparts if p.m is not None]) if kind == "q4" else None
    return TiledWeight(
        kind,
        sum(p.N for p in qparts),
        K,
        np.concatenate([p.codes for p in qparts]),
        np.concatenate([p.d for p in qparts]),
        m,
    )


def _dequantize_i8(w: TiledI8) -> np.ndarray:
    N, K, G = w.N, w.K, w.group
    u = w.codes.reshape(N // TILE, K // 4, TILE, 4).transpose(0, 2, 1, 3).reshape(N, K // G, G)
    c = u.astype(np.float32) - np.float32(128)  # exact: the int8 code as float32
    prod = _untile_groups(w.scale, N, K // G)[..., None] * c  # one float32 rounding
    o = _untile_groups(w.offset, N, K // G)[..., None] if w.offset is not None else np.float32(-0.0)
    return (prod + o).reshape(N, K)


def dequantize(w: Tiled) -> np.ndarray:
    """``W [N, K]`` float32 from a tiled weight (the layouts' inverse; for tests and references).
    I8: ``(scale * c) + offset`` in float32, bit for bit ``gguf_blocks.dequantize_kernel_form``."""
    if isinstance(w, TiledI8):
        return _dequantize_i8(w)
    N, K = w.N, w.K
    d = w.d.astype(np.float32).reshape(N // TILE, K // GROUP, TILE).transpose(0, 2, 1).reshape(N, K // GROUP)
    if w.kind == "q4":
        p = w.codes.reshape(N // TILE, K // 8, TILE, 4).transpose(0, 2, 1, 3)  # [tile, r, g, i]
        q = np.stack([p & 15, p >> 4], axis=3).reshape(N, K).astype(np.float32)
        assert w.m is not None
        m = w.m.astype(np.float32).reshape(N // TILE, K // GROUP, TILE).transpose(0, 2, 1).reshape(N, K // GROUP)
        return np.repeat(d, GROUP, axis=1) * q + np.repeat(m, GROUP, axis=1)
    u = w.codes.reshape(N // TILE, K // 4, TILE, 4).transpose(0, 2, 1, 3).reshape(N, K).astype(np.float32)
    return np.repeat(d, GROUP, axis=1) * (u - 128.0)
