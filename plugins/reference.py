"""NumPy references that DEFINE the meaning of the ``trtpipe`` custom ops (domain "trtpipe", v1).

Every lowering (ONNX Runtime), kernel (Triton) and engine (TensorRT) is compared against these
functions with stated tolerances. They favour clarity and strict input checking over speed: a
malformed input raises :class:`~trtpipe.plugins.errors.OpError` that names the field, the value,
what was expected and the fix, instead of silently reading the wrong memory.

Contents
--------
- :func:`paged_attention` -- ``trtpipe::PagedAttention`` (vLLM-style paged KV, GQA, causal,
  Hugging Face sliding-window convention). See ``docs/contracts.md``.
- :func:`int4_gemm`, :func:`dequantize_int4` -- ``trtpipe::Int4Gemm`` (weight-only INT4,
  blockwise along K, the ``com.microsoft::MatMulNBits`` packing).
- :func:`rope_cos_sin`, :func:`apply_rotary`, :func:`check_positions` -- rotary tables as
  Hugging Face transformers computes them (default / linear / llama3 rope types).

KV pool layout (per layer)::

    key_cache[NB, BS, KVH, D]      NB physical blocks of BS token slots each
        slot s  ->  block s // BS, offset s % BS
    block_tables[s, i] = physical block of logical block i of sequence s
    token at position p of sequence s lives in slot block_tables[s, p // BS] * BS + p % BS

This module imports only NumPy (and the error family): it is safe on the embedded runtime.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from trtpipe.plugins.errors import OpError

__all__ = [
    "paged_attention",
    "int4_gemm",
    "dequantize_int4",
    "unpack_int4_codes",
    "unpack_zero_points_uint8",
    "rope_inv_freq",
    "rope_cos_sin",
    "apply_rotary",
    "check_positions",
]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


# --------------------------------------------------------------------------------------------
# small validation helpers
# --------------------------------------------------------------------------------------------


def _shape_error(name: str, got: tuple, expected: str, fix: str = "") -> OpError:
    msg = f"{name}: shape {tuple(got)}, expected {expected}"
    if fix:
        msg += f"; {fix}"
    return OpError(msg)


def _as_int_array(name: str, x: Any, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise OpError(f"{name}: dtype {arr.dtype}, expected an integer dtype (int64 per contract)")
    if arr.ndim != ndim:
        raise _shape_error(name, arr.shape, f"a {ndim}-D array")
    return arr.astype(np.int64, copy=False)


def _as_float_array(name: str, x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype not in _FLOAT_DTYPES:
        raise OpError(f"{name}: dtype {arr.dtype}, expected float32 or float16")
    return arr


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) <= 0:
        raise OpError(f"attribute {name}={value!r}, expected a positive integer")
    return int(value)


# --------------------------------------------------------------------------------------------
# PagedAttention
# --------------------------------------------------------------------------------------------


def paged_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
    block_tables: np.ndarray,
    context_lens: np.ndarray,
    query_start_loc: np.ndarray,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float = 0.0,
    block_size: int,
    sliding_window: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference of ``trtpipe::PagedAttention``: write this step's K/V, then causal GQA attention.

    Follows vLLM's paged attention (``reshape_and_cache`` + ``flash_attn_varlen`` over block
    tables) with the Hugging Face sliding-window convention. Names: T tokens in the packed batch,
    S sequences, MB max blocks per sequence, NB blocks, BS = ``block_size``, H = ``num_heads``,
    KVH = ``num_kv_heads``, D = ``head_size``.

    Args:
        query: ``[T, H*D]`` float32|float16, RoPE already applied.
        key, value: ``[T, KVH*D]`` same dtype as query; this step's new tokens (RoPE applied to K).
        key_cache, value_cache: ``[NB, BS, KVH, D]`` float32|float16. Never mutated.
        slot_mapping: ``[T]`` int64, where token t is written: ``block_id*BS + position % BS``.
        block_tables: ``[S, MB]`` int64, logical block i of seq s -> physical block id
            (padding entries are 0, the null block, and are never read).
        context_lens: ``[S]`` int64, tokens of seq s in the pool AFTER this step (chunk included).
        query_start_loc: ``[S+1]`` int64, seq s owns packed tokens ``[qsl[s], qsl[s+1])``;
            ``qsl[0] == 0`` and ``qsl[S] == T``. A sequence may own zero tokens.
        num_heads, num_kv_heads, head_size, block_size: attributes (positive ints,
            ``num_heads % num_kv_heads == 0``).
        scale: softmax scale; 0.0 means ``1/sqrt(head_size)``.
        sliding_window: W in tokens; 0 disables it. A query at position p sees keys j with
            ``p - W < j <= p`` (Hugging Face / ORT ``local_window_size`` convention: the token
            itself and the W-1 before it).

    Returns:
        ``(output [T, H*D] query dtype, key_cache_out, value_cache_out)``: the caches are new
        arrays equal to the inputs with this step's K/V written at ``slot_mapping``.

    Meaning: token t = qsl[s] + i has position ``p = context_lens[s] - (qsl[s+1]-qsl[s]) + i``
    and attends to keys j in ``[0, context_lens[s])`` read from slot
    ``block_tables[s, j // BS]*BS + j % BS`` iff ``j <= p`` and ``(W == 0 or j > p - W)``.
    Query head h uses kv head ``h // (H // KVH)``. Scores, softmax and the weighted sum are
    float32; the output is cast to the query dtype.

    Raises:
        OpError: bad attribute, shape or dtype; ``qsl`` not a valid offset vector; a negative
            first position (context_lens shorter than the chunk); a context longer than the
            block table covers; a block table entry out of ``[0, NB)`` for a key some query
            sees; a slot_mapping entry out of range or inconsistent with the block table.
    """
    H = _positive_int("num_heads", num_heads)
    KVH = _positive_int("num_kv_heads", num_kv_heads)
    D = _positive_int("head_size", head_size)
    BS = _positive_int("block_size", block_size)
    W = int(sliding_window)
    if W < 0:
        raise OpError(f"attribute sliding_window={sliding_window}, expected >= 0 (0 = off)")
    if H % KVH != 0:
        raise OpError(
            f"attributes num_heads={H}, num_kv_heads={KVH}: num_heads must be a multiple of "
            "num_kv_heads (GQA groups)"
        )
    scale = float(scale)
    if scale == 0.0:
        scale = 1.0 / math.sqrt(D)

    query = _as_float_array("query", query)
    key = _as_float_array("key", key)
    value = _as_float_array("value", value)
    key_cache = _as_float_array("key_cache", key_cache)
    value_cache = _as_float_array("value_cache", value_cache)
    slot_mapping = _as_int_array("slot_mapping", slot_mapping, 1)
    block_tables = _as_int_array("block_tables", block_tables, 2)
    context_lens = _as_int_array("context_lens", context_lens, 1)
    qsl = _as_int_array("query_start_loc", query_start_loc, 1)

    if query.ndim != 2 or query.shape[1] != H * D:
        raise _shape_error("query", query.shape, f"[T, num_heads*head_size] = [T, {H * D}]")
    T = query.shape[0]
    for name, arr in (("key", key), ("value", value)):
        if arr.shape != (T, KVH * D):
            raise _shape_error(name, arr.shape, f"[T, num_kv_heads*head_size] = [{T}, {KVH * D}]")
    if key_cache.ndim != 4 or key_cache.shape[1:] != (BS, KVH, D):
        raise _shape_error(
            "key_cache", key_cache.shape, f"[NB, block_size, num_kv_heads, head_size] = [NB, {BS}, {KVH}, {D}]"
        )
    if value_cache.shape != key_cache.shape:
        raise _shape_error("value_cache", value_cache.shape, f"the key_cache shape {key_cache.shape}")
    NB = key_cache.shape[0]
    if slot_mapping.shape != (T,):
        raise _shape_error("slot_mapping", slot_mapping.shape, f"[T] = [{T}]")
    S, MB = block_tables.shape
    if context_lens.shape != (S,):
        raise _shape_error("context_lens", context_lens.shape, f"[S] = [{S}] (rows of block_tables)")
    if qsl.shape != (S + 1,):
        raise _shape_error("query_start_loc", qsl.shape, f"[S+1] = [{S + 1}]")
    if S > 0 and (qsl[0] != 0 or qsl[-1] != T or np.any(np.diff(qsl) < 0)):
        raise OpError(
            f"query_start_loc={qsl.tolist()}: expected non-decreasing offsets from 0 to T={T}"
        )
    if S == 0 and T != 0:
        raise OpError(f"block_tables has 0 sequences but the batch has T={T} tokens")

    # Write first: KV is written once per token, before any query reads the pool.
    key_cache_out = key_cache.copy()
    value_cache_out = value_cache.copy()
    bad = np.nonzero((slot_mapping < 0) | (slot_mapping >= NB * BS))[0]
    if bad.size:
        t = int(bad[0])
        raise OpError(
            f"slot_mapping[{t}]={int(slot_mapping[t])} is outside the pool [0, NB*block_size) = "
            f"[0, {NB * BS})"
        )
    blk, off = slot_mapping // BS, slot_mapping % BS
    key_cache_out[blk, off] = key.reshape(T, KVH, D).astype(key_cache.dtype)
    value_cache_out[blk, off] = value.reshape(T, KVH, D).astype(value_cache.dtype)

    output = np.zeros((T, H, D), dtype=np.float32)
    group = H // KVH
    kc32 = key_cache_out.astype(np.float32)
    vc32 = value_cache_out.astype(np.float32)
    q32 = query.astype(np.float32).reshape(T, H, D)
    for s in range(S):
        start, end = int(qsl[s]), int(qsl[s + 1])
        n = end - start
        if n == 0:
            continue
        ctx = int(context_lens[s])
        first = ctx - n
        if first < 0:
            raise OpError(
                f"context_lens[{s}]={ctx} is shorter than its chunk of {n} tokens, so the first "
                f"position would be {first}; context_lens counts the tokens in the pool AFTER "
                "this step, chunk included"
            )
        if ctx > MB * BS:
            raise OpError(
                f"context_lens[{s}]={ctx} needs {-(-ctx // BS)} blocks but block_tables has only "
                f"MB={MB} columns (block_size={BS}); widen block_tables"
            )
        positions = first + np.arange(n)  # [n]
        # Keys that some query of this chunk can see: [lo, ctx).
        lo = max(0, first - W + 1) if W > 0 else 0
        j = np.arange(ctx)
        logical = j // BS
        phys = block_tables[s, logical]  # [ctx]
        needed = j >= lo
        bad = np.nonzero(needed & ((phys < 0) | (phys >= NB)))[0]
        if bad.size:
            jj = int(bad[0])
            raise OpError(
                f"block_tables[{s}, {jj // BS}]={int(phys[jj])} is outside [0, NB={NB}) but key "
                f"position {jj} of sequence {s} is visible to its queries"
            )
        expected_slots = phys[positions] * BS + positions % BS
        mismatch = np.nonzero(slot_mapping[start:end] != expected_slots)[0]
        if mismatch.size:
            i = int(mismatch[0])
            raise OpError(
                f"slot_mapping[{start + i}]={int(slot_mapping[start + i])} but token {i} of "
                f"sequence {s} has position {int(positions[i])}, whose slot by block_tables is "
                f"{int(expected_slots[i])}; slot = block_tables[s, p // block_size]*block_size "
                "+ p % block_size"
            )
        jn = j[lo:]
        slots = phys[lo:] * BS + jn % BS
        k = kc32[slots // BS, slots % BS]  # [L, KVH, D]
        v = vc32[slots // BS, slots % BS]
        k = np.repeat(k, group, axis=1)  # [L, H, D]: query head h -> kv head h // group
        v = np.repeat(v, group, axis=1)
        q = q32[start:end]  # [n, H, D]
        scores = np.einsum("nhd,lhd->hnl", q, k) * np.float32(scale)  # [H, n, L]
        visible = jn[None, :] <= positions[:, None]  # [n, L]
        if W > 0:
            visible &= jn[None, :] > positions[:, None] - W
        scores = np.where(visible[None], scores, -np.inf).astype(np.float32)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        output[start:end] = np.einsum("hnl,lhd->nhd", probs, v)
    return output.reshape(T, H * D).astype(query.dtype), key_cache_out, value_cache_out


# --------------------------------------------------------------------------------------------
# Int4Gemm
# --------------------------------------------------------------------------------------------


def _check_group_size(K: int, group_size: int) -> None:
    G = int(group_size)
    if G < 16 or G & (G - 1):
        raise OpError(f"group_size={group_size}: expected a power of two >= 16 (16, 32, 64, 128, ...)")
    if K % G != 0:
        divisors = [g for g in (16, 32, 64, 128, 256, 512, 1024) if K % g == 0]
        fix = (
            f"pick a group size that divides K: {divisors}" if divisors
            else "K has no power-of-two divisor >= 16; keep this layer unquantized"
        )
        raise OpError(f"K={K} is not a multiple of group_size={G}; {fix}")


def unpack_int4_codes(b_packed: np.ndarray, K: int, N: int, group_size: int) -> np.ndarray:
    """Unpack ``[N, K/G, G/2]`` uint8 (MatMulNBits order) to codes ``[N, K]`` uint8 in 0..15.

    Byte i of each block holds code 2i in the low nibble and code 2i+1 in the high nibble.
    """
    _check_group_size(K, group_size)
    G = int(group_size)
    b = np.asarray(b_packed)
    if b.dtype != np.uint8:
        raise OpError(f"b_packed: dtype {b.dtype}, expected uint8")
    if b.shape != (N, K // G, G // 2):
        raise _shape_error("b_packed", b.shape, f"[N, K/G, G/2] = [{N}, {K // G}, {G // 2}]")
    codes = np.empty((N, K // G, G // 2, 2), dtype=np.uint8)
    codes[..., 0] = b & 0x0F
    codes[..., 1] = b >> 4
    return codes.reshape(N, K)


def unpack_zero_points_uint8(zp_packed: np.ndarray, N: int, num_blocks: int) -> np.ndarray:
    """Unpack uint8 zero points ``[N, ceil(num_blocks/2)]`` to ``[N, num_blocks]`` uint8 0..15.

    Same nibble order as the codes along the block axis (block 2i low, 2i+1 high), per row n.
    """
    zp = np.asarray(zp_packed)
    cols = (num_blocks + 1) // 2
    if zp.dtype != np.uint8 or zp.shape != (N, cols):
        raise OpError(
            f"zero_points: uint8 shape {zp.shape} dtype {zp.dtype}, expected packed uint8 "
            f"[N, ceil(K/G/2)] = [{N}, {cols}]"
        )
    out = np.empty((N, cols, 2), dtype=np.uint8)
    out[..., 0] = zp & 0x0F
    out[..., 1] = zp >> 4
    return out.reshape(N, 2 * cols)[:, :num_blocks]


def dequantize_int4(
    b_packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    K: int,
    N: int,
    group_size: int,
    bits: int = 4,
) -> np.ndarray:
    """Dequantize ``trtpipe::Int4Gemm`` weights: ``W[n, k] = (q[n, k] - zp[n, b]) * scale[n, b]``.

    Args:
        b_packed: ``[N, K/G, G/2]`` uint8 codes (``com.microsoft::MatMulNBits`` packing).
        scales: ``[N, K/G]`` float32|float16.
        zero_points: None (8, symmetric), float ``[N, K/G]`` (same dtype as scales; any real
            value, e.g. ``-min/scale`` for GGUF Q4_1) or packed uint8 ``[N, ceil(K/G/2)]``.
        K, N, group_size: attributes; G a power of two >= 16 dividing K.

    ``bits=8`` (used for an 8-bit LM head, e.g. GGUF Q8_0): codes are unpacked bytes
    ``[N, K/G, G]`` uint8, the default zero point is 128 and uint8 zero points are unpacked
    ``[N, K/G]`` (``com.microsoft::MatMulNBits`` bits=8 layout).

    Returns:
        ``W [N, K]`` float32, computed in float32 as ``(float32(q) - float32(zp)) * float32(scale)``.

    Raises:
        OpError: K % G != 0 (names K and G and the group sizes that divide K), bad shapes/dtypes,
        bits not 4 or 8.
    """
    K, N = int(K), int(N)
    _check_group_size(K, group_size)
    G = int(group_size)
    nb = K // G
    if int(bits) == 8:
        b = np.asarray(b_packed)
        if b.dtype != np.uint8 or b.shape != (N, nb, G):
            raise _shape_error("b_packed", b.shape, f"uint8 [N, K/G, G] = [{N}, {nb}, {G}] for bits=8")
        codes = b.astype(np.float32)
        s = np.asarray(scales)
        if zero_points is None:
            zp = np.full((N, nb), 128.0, np.float32)
        else:
            zp = np.asarray(zero_points).astype(np.float32).reshape(N, nb)
        return ((codes - zp[:, :, None]) * s.astype(np.float32)[:, :, None]).reshape(N, K)
    if int(bits) != 4:
        raise OpError(f"attribute bits={bits}: trtpipe::Int4Gemm supports bits=4 (and 8 for LM heads)")
    codes = unpack_int4_codes(b_packed, K, N, G).reshape(N, nb, G).astype(np.float32)
    s = np.asarray(scales)
    if s.dtype not in _FLOAT_DTYPES:
        raise OpError(f"scales: dtype {s.dtype}, expected float32 or float16")
    if s.shape != (N, nb):
        raise _shape_error("scales", s.shape, f"[N, K/G] = [{N}, {nb}]")
    if zero_points is None:
        zp = np.full((N, nb), 8.0, dtype=np.float32)
    else:
        z = np.asarray(zero_points)
        if z.dtype == np.uint8:
            zp = unpack_zero_points_uint8(z, N, nb).astype(np.float32)
        elif z.dtype in _FLOAT_DTYPES:
            if z.dtype != s.dtype:
                raise OpError(f"zero_points: dtype {z.dtype}, expected the scales dtype {s.dtype}")
            if z.shape != (N, nb):
                raise _shape_error("zero_points", z.shape, f"float [N, K/G] = [{N}, {nb}]")
            zp = z.astype(np.float32)
        else:
            raise OpError(f"zero_points: dtype {z.dtype}, expected uint8 (packed) or the scales dtype")
    w = (codes - zp[:, :, None]) * s.astype(np.float32)[:, :, None]
    return w.reshape(N, K)


def int4_gemm(
    a: np.ndarray,
    b_packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    group_size: int,
    bits: int = 4,
) -> np.ndarray:
    """Reference of ``trtpipe::Int4Gemm``: ``Y[..., N] = A[..., K] @ W^T`` (float32 accumulate).

    Same semantics as ``com.microsoft::MatMulNBits`` (bits=4, block_size=G, no g_idx, no bias).
    ``W`` comes from :func:`dequantize_int4`. ``A`` is float32|float16; ``Y`` has A's dtype.

    Raises:
        OpError: bits != 4, A's last dim != K, K % G != 0, or any input shape/dtype mismatch.
    """
    if int(bits) not in (4, 8):
        raise OpError(f"attribute bits={bits}: trtpipe::Int4Gemm supports bits=4 (and 8 for LM heads)")
    a = _as_float_array("A", a)
    if a.ndim < 1 or a.shape[-1] != int(K):
        raise _shape_error("A", a.shape, f"[..., K] with K={K}")
    w = dequantize_int4(b_packed, scales, zero_points, K, N, group_size, bits)
    y = a.astype(np.float32) @ w.T
    return y.astype(a.dtype)


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


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
    D = _positive_int("head_dim", head_dim)
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
    raise OpError(
        f"rope_type {rope_type!r} is not supported; supported: default (None), linear, llama3"
    )


def rope_cos_sin(
    max_positions: int,
    head_dim: int,
    theta: float,
    scaling: Mapping[str, Any] | None = None,
    dtype: Any = np.float32,
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
    P = _positive_int("max_positions", max_positions)
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
