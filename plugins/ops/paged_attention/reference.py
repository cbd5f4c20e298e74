"""NumPy reference that DEFINES ``trtpipe::PagedAttention`` (domain "trtpipe", v1): vLLM-style
paged KV, GQA, causal, Hugging Face sliding-window convention (see ``docs/contracts.md``).

Every lowering (ONNX Runtime), kernel (Triton) and engine (TensorRT) is compared against
:func:`paged_attention` with stated tolerances. It favours clarity and strict input checking over
speed: a malformed input raises :class:`~trtpipe.plugins.core.errors.OpError` that names the
field, the value, what was expected and the fix, instead of silently reading the wrong memory.
Its parameter list is the op's description's (:data:`~trtpipe.plugins.ops.paged_attention.spec.PAGED_ATTENTION`,
bound by :meth:`~trtpipe.plugins.ops.spec.OpSpec.implement`).

KV pool layout (per layer)::

    key_cache[KVH, NB, BS, D]      per kv head: NB physical blocks of BS token slots each
        slot s  ->  block s // BS, offset s % BS (the same slot in every kv head)
    Head-major so that gathering a sequence's blocks (axis 1) yields ``[KVH, S, MB*BS, D]``,
    which attention multiplies without any transpose (docs/contracts.md).
    block_tables[s, i] = physical block of logical block i of sequence s
    token at position p of sequence s lives in slot block_tables[s, p // BS] * BS + p % BS

This module imports only NumPy (and the error family): it is safe on the embedded runtime.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from trtpipe.plugins.core.arith import cdiv
from trtpipe.plugins.core.checks import as_float_array, as_int_array, positive_int, shape_error
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import kv_decode, kv_dtype_of_array, kv_encode, kv_has_scales
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION

__all__ = ["paged_attention"]


@PAGED_ATTENTION.implement()
def paged_attention(a: SimpleNamespace) -> tuple[np.ndarray, ...]:
    """Reference of ``trtpipe::PagedAttention``: write this step's K/V, then causal GQA attention.

    ``paged_attention(query, key, value, key_cache, value_cache, slot_mapping, block_tables,
    context_lens, query_start_loc, key_scale=None, value_scale=None, *, num_heads, num_kv_heads,
    head_size, scale=0.0, block_size, sliding_window=0)``.

    Follows vLLM's paged attention (``reshape_and_cache`` + ``flash_attn_varlen`` over block
    tables) with the Hugging Face sliding-window convention. Names: T tokens in the packed batch,
    S sequences, MB max blocks per sequence, NB blocks, BS = ``block_size``, H = ``num_heads``,
    KVH = ``num_kv_heads``, D = ``head_size``.

    Args:
        query: ``[T, H*D]`` float32|float16, RoPE already applied.
        key, value: ``[T, KVH*D]`` same dtype as query; this step's new tokens (RoPE applied to K).
        key_cache, value_cache: ``[KVH, NB, BS, D]`` (head-major), the pool's storage dtype
            (:mod:`trtpipe.plugins.core.kv_codec`): float32 | float16 | uint16 (bf16 bits) | int8.
            Never mutated.
        slot_mapping: ``[T]`` int64, where token t is written: ``block_id*BS + position % BS``.
        block_tables: ``[S, MB]`` int64, logical block i of seq s -> physical block id
            (padding entries are 0, the null block, and are never read).
        context_lens: ``[S]`` int64, tokens of seq s in the pool AFTER this step (chunk included).
        query_start_loc: ``[S+1]`` int64, seq s owns packed tokens ``[qsl[s], qsl[s+1])``;
            ``qsl[0] == 0`` and ``qsl[S] == T``. A sequence may own zero tokens.
        num_heads, num_kv_heads, head_size, block_size: attributes (positive ints,
            ``num_heads % num_kv_heads == 0``).
        scale: softmax scale; 0.0 means ``1/sqrt(head_size)``.
        key_scale, value_scale: ``[KVH, NB, BS]`` float32, the int8 pool's per token-head scales
            (required with int8 caches, refused with float ones). Never mutated.
        sliding_window: W in tokens; 0 disables it. A query at position p sees keys j with
            ``p - W < j <= p`` (Hugging Face / ORT ``local_window_size`` convention: the token
            itself and the W-1 before it).

    Returns:
        ``(output [T, H*D] query dtype, key_cache_out, value_cache_out)``, plus
        ``(key_scale_out, value_scale_out)`` for an int8 pool: new arrays equal to the inputs
        with this step's K/V encoded (:func:`~trtpipe.plugins.core.kv_codec.kv_encode`) and
        written at ``slot_mapping``.

    Meaning: token t = qsl[s] + i has position ``p = context_lens[s] - (qsl[s+1]-qsl[s]) + i``
    and attends to keys j in ``[0, context_lens[s])`` read from slot
    ``block_tables[s, j // BS]*BS + j % BS`` iff ``j <= p`` and ``(W == 0 or j > p - W)``.
    Query head h uses kv head ``h // (H // KVH)``. Keys and values are read decoded to float32
    (:func:`~trtpipe.plugins.core.kv_codec.kv_decode`: this step's tokens too, so every token
    is seen as the pool holds it). Scores, softmax and the weighted sum are float32; the output
    is cast to the query dtype.

    Raises:
        OpError: bad attribute, shape or dtype; ``qsl`` not a valid offset vector; a negative
            first position (context_lens shorter than the chunk); a context longer than the
            block table covers; a block table entry out of ``[0, NB)`` for a key some query
            sees; a slot_mapping entry out of range or inconsistent with the block table.
    """
    H, KVH, D, BS, W, scale = _attention_attributes(a)
    x = _attention_inputs(a, H=H, KVH=KVH, D=D, BS=BS)
    T = x.query.shape[0]
    S = x.block_tables.shape[0]

    # Write first: KV is written once per token, before any query reads the pool.
    caches = _write_kv(x, BS)

    output = np.zeros((T, H, D), dtype=np.float32)
    kc32 = kv_decode(caches[0], caches[2] if x.kv_dtype == "int8" else None, x.kv_dtype)
    vc32 = kv_decode(caches[1], caches[3] if x.kv_dtype == "int8" else None, x.kv_dtype)
    q32 = x.query.astype(np.float32).reshape(T, H, D)
    qsl = x.query_start_loc
    for s in range(S):
        start, end = int(qsl[s]), int(qsl[s + 1])
        if end == start:
            continue
        positions, keys_pos, slots = _sequence_keys(
            s,
            end - start,
            int(x.context_lens[s]),
            x.block_tables,
            x.slot_mapping[start:end],
            start,
            NB=x.key_cache.shape[1],
            BS=BS,
            W=W,
        )
        k = kc32[:, slots // BS, slots % BS].transpose(1, 0, 2)  # [L, KVH, D]
        v = vc32[:, slots // BS, slots % BS].transpose(1, 0, 2)
        output[start:end] = _attend(q32[start:end], k, v, positions, keys_pos, H // KVH, scale, W)
    return (output.reshape(T, H * D).astype(x.query.dtype), *caches)


def _attention_inputs(a: SimpleNamespace, *, H: int, KVH: int, D: int, BS: int) -> SimpleNamespace:
    """The op's inputs (:data:`PAGED_ATTENTION` order) as checked arrays: float ones
    float32|float16, index ones int64 of the description's rank; then the shape contract."""
    x = SimpleNamespace()
    for t in PAGED_ATTENTION.inputs:
        v = getattr(a, t.arg_name)
        if t.type == "T_CACHE" or (t.type == "T_SCALE" and v is None):
            setattr(x, t.name, None if v is None else np.asarray(v))
        else:
            setattr(x, t.name, as_float_array(t.name, v) if t.rank is None else as_int_array(t.name, v, t.rank))
    _check_attention_shapes(x, H, KVH, D, BS)
    _check_pool_dtype(x)
    return x


def _check_pool_dtype(x: SimpleNamespace) -> None:
    """``x.kv_dtype`` from the caches' dtype (one dtype for both); scales iff int8, float32,
    ``[KVH, NB, BS]``."""
    try:
        x.kv_dtype = kv_dtype_of_array(x.key_cache)
    except ValueError as e:
        raise OpError(f"key_cache: {e}") from None
    if x.value_cache.dtype != x.key_cache.dtype:
        raise OpError(f"value_cache: dtype {x.value_cache.dtype}, expected the key_cache dtype {x.key_cache.dtype}")
    if x.key_cache.dtype.name == "bfloat16":  # an ml_dtypes array: the same bits as uint16
        x.key_cache, x.value_cache = x.key_cache.view(np.uint16), x.value_cache.view(np.uint16)
    for name in ("key_scale", "value_scale"):
        sc = getattr(x, name)
        if not kv_has_scales(x.kv_dtype):
            if sc is not None:
                raise OpError(f"{name} given with a {x.kv_dtype} pool: scales belong to an int8 pool only")
            continue
        if sc is None:
            raise OpError(f"{name} missing: an int8 pool needs its float32 scales [KVH, NB, BS]")
        if sc.dtype != np.float32 or sc.shape != x.key_cache.shape[:3]:
            raise shape_error(name, sc.shape, f"float32 {list(x.key_cache.shape[:3])} (got dtype {sc.dtype})")


def _attention_attributes(a: SimpleNamespace) -> tuple[int, int, int, int, int, float]:
    """``(H, KVH, D, BS, W, scale)`` after the attribute checks; scale 0.0 -> ``1/sqrt(D)``."""
    H = positive_int("num_heads", a.num_heads)
    KVH = positive_int("num_kv_heads", a.num_kv_heads)
    D = positive_int("head_size", a.head_size)
    BS = positive_int("block_size", a.block_size)
    W = int(a.sliding_window)
    if W < 0:
        raise OpError(f"attribute sliding_window={a.sliding_window}, expected >= 0 (0 = off)")
    if H % KVH != 0:
        raise OpError(
            f"attributes num_heads={H}, num_kv_heads={KVH}: num_heads must be a multiple of num_kv_heads (GQA groups)"
        )
    scale = float(a.scale)
    return H, KVH, D, BS, W, (1.0 / math.sqrt(D) if scale == 0.0 else scale)


def _check_attention_shapes(x: SimpleNamespace, H: int, KVH: int, D: int, BS: int) -> None:
    """The shape contract of :func:`paged_attention` (T, S, NB from the inputs)."""
    query, key_cache, value_cache, block_tables = x.query, x.key_cache, x.value_cache, x.block_tables
    qsl = x.query_start_loc
    if query.ndim != 2 or query.shape[1] != H * D:
        raise shape_error("query", query.shape, f"[T, num_heads*head_size] = [T, {H * D}]")
    T = query.shape[0]
    for name, arr in (("key", x.key), ("value", x.value)):
        if arr.shape != (T, KVH * D):
            raise shape_error(name, arr.shape, f"[T, num_kv_heads*head_size] = [{T}, {KVH * D}]")
    if key_cache.ndim != 4 or key_cache.shape[0] != KVH or key_cache.shape[2:] != (BS, D):
        raise shape_error(
            "key_cache", key_cache.shape, f"[num_kv_heads, NB, block_size, head_size] = [{KVH}, NB, {BS}, {D}]"
        )
    if value_cache.shape != key_cache.shape:
        raise shape_error("value_cache", value_cache.shape, f"the key_cache shape {key_cache.shape}")
    if x.slot_mapping.shape != (T,):
        raise shape_error("slot_mapping", x.slot_mapping.shape, f"[T] = [{T}]")
    S = block_tables.shape[0]
    if x.context_lens.shape != (S,):
        raise shape_error("context_lens", x.context_lens.shape, f"[S] = [{S}] (rows of block_tables)")
    if qsl.shape != (S + 1,):
        raise shape_error("query_start_loc", qsl.shape, f"[S+1] = [{S + 1}]")
    if S > 0 and (qsl[0] != 0 or qsl[-1] != T or np.any(np.diff(qsl) < 0)):
        raise OpError(f"query_start_loc={qsl.tolist()}: expected non-decreasing offsets from 0 to T={T}")
    if S == 0 and T != 0:
        raise OpError(f"block_tables has 0 sequences but the batch has T={T} tokens")


def _write_kv(x: SimpleNamespace, BS: int) -> tuple[np.ndarray, ...]:
    """New caches (and int8 scales) equal to ``x``'s with token t's K/V encoded at slot
    ``slot_mapping[t]``: ``(key_cache, value_cache[, key_scale, value_scale])``."""
    key_cache, slot_mapping = x.key_cache, x.slot_mapping
    KVH, NB, _, D = key_cache.shape
    T = x.key.shape[0]
    bad = np.nonzero((slot_mapping < 0) | (slot_mapping >= NB * BS))[0]
    if bad.size:
        t = int(bad[0])
        raise OpError(
            f"slot_mapping[{t}]={int(slot_mapping[t])} is outside the pool [0, NB*block_size) = [0, {NB * BS})"
        )
    blk, off = slot_mapping // BS, slot_mapping % BS
    caches, scales = [], []
    for new, cache, scale in ((x.key, key_cache, x.key_scale), (x.value, x.value_cache, x.value_scale)):
        codes, sc = kv_encode(new.reshape(T, KVH, D).transpose(1, 0, 2), x.kv_dtype)  # [KVH, T, D], [KVH, T]
        out = cache.copy()
        out[:, blk, off] = codes
        caches.append(out)
        if sc is not None:
            scales.append(scale.copy())
            scales[-1][:, blk, off] = sc
    return (*caches, *scales)


def _sequence_keys(
    s: int, n: int, ctx: int, block_tables: np.ndarray, seq_slots: np.ndarray, start: int, *, NB: int, BS: int, W: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequence ``s`` with ``n`` chunk tokens and ``ctx`` tokens in the pool after this step:
    ``(positions [n], visible key positions [L], their slots [L])`` where the keys are those
    some query of the chunk can see (``[lo, ctx)``). Checks the chunk, the block table and the
    chunk's ``seq_slots`` (``slot_mapping[start:start+n]``) against each other."""
    MB = block_tables.shape[1]
    first = ctx - n
    if first < 0:
        raise OpError(
            f"context_lens[{s}]={ctx} is shorter than its chunk of {n} tokens, so the first "
            f"position would be {first}; context_lens counts the tokens in the pool AFTER "
            "this step, chunk included"
        )
    if ctx > MB * BS:
        raise OpError(
            f"context_lens[{s}]={ctx} needs {cdiv(ctx, BS)} blocks but block_tables has only "
            f"MB={MB} columns (block_size={BS}); widen block_tables"
        )
    positions = first + np.arange(n)  # [n]
    lo = max(0, first - W + 1) if W > 0 else 0
    j = np.arange(ctx)
    phys = block_tables[s, j // BS]  # [ctx]
    bad = np.nonzero((j >= lo) & ((phys < 0) | (phys >= NB)))[0]
    if bad.size:
        jj = int(bad[0])
        raise OpError(
            f"block_tables[{s}, {jj // BS}]={int(phys[jj])} is outside [0, NB={NB}) but key "
            f"position {jj} of sequence {s} is visible to its queries"
        )
    expected_slots = phys[positions] * BS + positions % BS
    mismatch = np.nonzero(seq_slots != expected_slots)[0]
    if mismatch.size:
        i = int(mismatch[0])
        raise OpError(
            f"slot_mapping[{start + i}]={int(seq_slots[i])} but token {i} of "
            f"sequence {s} has position {int(positions[i])}, whose slot by block_tables is "
            f"{int(expected_slots[i])}; slot = block_tables[s, p // block_size]*block_size "
            "+ p % block_size"
        )
    return positions, j[lo:], phys[lo:] * BS + j[lo:] % BS


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    keys_pos: np.ndarray,
    group: int,
    scale: float,
    W: int,
) -> np.ndarray:
    """Causal (+ window) GQA softmax attention in float32: q ``[n, H, D]``, k/v ``[L, KVH, D]``
    -> ``[n, H, D]``; query head h uses kv head ``h // group``."""
    k = np.repeat(k, group, axis=1)  # [L, H, D]
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("nhd,lhd->hnl", q, k) * np.float32(scale)  # [H, n, L]
    visible = keys_pos[None, :] <= positions[:, None]  # [n, L]
    if W > 0:
        visible &= keys_pos[None, :] > positions[:, None] - W
    scores = np.where(visible[None], scores, -np.inf).astype(np.float32)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.einsum("hnl,lhd->nhd", probs, v)
