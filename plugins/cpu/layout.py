"""Tile-interleaved weight layouts of the host CPU kernels (``csrc/tp.h``), built from blockwise
codes in NumPy. Exact: codes are moved, never requantized; scales and minimums are stored fp16,
which holds GGUF Q4_1 / Q8_0 fields (fp16 in the file) without rounding.

    Q4  codes [N/16][K/8][16][4] uint8   byte i of row r, k-group g: q[r, 8g+i] | q[r, 8g+4+i] << 4
        d, m  [N/16][K/32][16] fp16      w[n, k] = d[n, k // 32] * q[n, k] + m[n, k // 32]
    Q8  codes [N/16][K/4][16][4] uint8   u[r, 4j+i]
        d     [N/16][K/32][16] fp16      w[n, k] = d[n, k // 32] * (u[n, k] - 128)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpipe.plugins.core.errors import OpError

GROUP = 32
TILE = 16


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


def concat_rows(name: str, parts: list[TiledWeight]) -> TiledWeight:
    """Weights stacked along N (fused QKV, gate/up): tiles concatenate, since each tile is whole."""
    kinds = {p.kind for p in parts}
    Ks = {p.K for p in parts}
    if len(kinds) != 1 or len(Ks) != 1:
        raise OpError(f"{name}: cannot fuse linears of kinds {sorted(kinds)} and K {sorted(Ks)}")
    kind, K = kinds.pop(), Ks.pop()
    m = np.concatenate([p.m for p in parts if p.m is not None]) if kind == "q4" else None
    return TiledWeight(
        kind,
        sum(p.N for p in parts),
        K,
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.d for p in parts]),
        m,
    )


def dequantize(w: TiledWeight) -> np.ndarray:
    """``W [N, K]`` float32 from a tiled weight (the layouts' inverse; for tests and references)."""
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
