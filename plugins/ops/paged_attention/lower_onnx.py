"""``trtpipe::PagedAttention`` in standard ONNX ops, shared by the ONNX Runtime lowering and
TensorRT's plugin-free lowering (:func:`lower_paged_attention`).

1. write: ``ScatterND(key_cache, [kv_head, block, offset], key)`` whose output is the graph's
   ``present_*`` output. ONNX Runtime binds ``past_*`` and ``present_*`` to the same buffer
   (IOBinding) and its ScatterND skips the input copy when source and target are the same
   memory, so KV is written once per token (TensorRT's ScatterND writes a new tensor instead).
2. read: ``Gather(cache, block_tables, axis=1)`` -> per-sequence keys ``[KVH, S, MB*BS, D]``
   (the pool is head-major, so this is already the batched-matmul layout: no K/V transposes);
   prefill queries are gathered into a padded ``[S, Qmax]`` layout (decode: one query per
   sequence, no padding); GQA is a reshape ``[KVH, S, G*Qmax, D]`` of the (small) queries;
   causal + window mask by ``Where``; ``Softmax``; ``MatMul``; prefill gathers back to packed
   tokens.
3. mixed (``split_decode_rows``, the ONNX Runtime prefill graph): the batch's *trailing* rows
   of one query token each (decode tokens riding in a prefill call, a step's decodes fused with
   its prompt chunks) take the decode path, the leading rows the padded one, and the two outputs
   are concatenated in token order. Without it a 1-token row is padded to the longest chunk's
   ``Qmax`` and costs a whole chunk's attention. Which rows are trailing is computed in the graph
   (a reverse ``CumSum`` over ``q_len != 1``), so any row order is correct; putting 1-token rows
   last (:class:`trtpipe.runtime.sched.batch.PrefillBatch` does) is what makes it fast. Either part may
   be empty: every reshape spells its sizes out (no ``-1`` next to a zero-sized dimension).

Index tensors derived from ``slot_mapping``, ``block_tables``, ``context_lens`` and
``query_start_loc`` are built once per graph (``GraphRewrite.memo``) and shared by all layers;
masks are shared by the layers with the same window.

Pool layout (per layer, K and V alike)::

    cache[KVH, NB, BS, D]   block 0 = null block (head-major, docs/contracts.md)
      slot = block_id * BS + position % BS  ->  (h, slot // BS, slot % BS) for kv head h

Meaning: :func:`trtpipe.plugins.ops.paged_attention.reference.paged_attention` (tests compare both lowerings to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from trtpipe.plugins.core.dtypes import DTYPES
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.graph.rewrite import GraphRewrite, NodeBuilder, node_attributes

__all__ = ["lower_paged_attention"]


def lower_paged_attention(
    node: onnx.NodeProto, state: GraphRewrite, *, decode: bool, split_decode_rows: bool = False, kv_dtype: str = "fp32"
) -> None:
    """Rewrite one ``PagedAttention`` node into standard ops appended to ``state``.

    ``decode``: one query token per sequence (``query_start_loc`` = 0..S): no padded query
    layout. ``split_decode_rows`` (prefill graphs only): trailing 1-token rows take the decode
    path (module docstring, 3.). The index subgraph of the node's (slot_mapping, block_tables,
    context_lens, query_start_loc, block_size) is emitted once, before the first layer reading
    it, under ``/model/paged_attention_index``; the KV write's ``[T, KVH, 3]`` index once per
    kv-head count, under ``/model/paged_attention_write_index_kvh{KVH}``. ``kv_dtype``: the pool's
    (:func:`~trtpipe.plugins.ops.paged_attention.kv_pool_types.retype_kv_pool` typed it; int8 nodes
    carry the scale inputs/outputs): this step's K/V are encoded before the write (Cast; int8:
    per token-head absmax scale, Round, Clip) and the gathered keys/values decoded after the read
    (Cast; int8: times the gathered scales), as :mod:`trtpipe.plugins.core.kv_codec` defines.
    Raises :class:`OpError` when num_heads is not a multiple of num_kv_heads, or for an int8
    pool without its scales.
    """
    attrs = node_attributes(node)
    block_size = attrs["block_size"]
    mode = "decode" if decode else ("mixed" if split_decode_rows else "prefill")
    key = ("paged_attention_index", tuple(node.input[5:9]), block_size, mode)
    if key not in state.memo:
        ib = NodeBuilder("/model/paged_attention_index")
        slot_mapping, block_tables, context_lens, qsl = node.input[5:9]
        idx: dict[str, Any]
        if mode == "decode":
            idx = {"dec": _decode_index_subgraph(ib, slot_mapping, block_tables, context_lens, block_size)}
        elif mode == "prefill":
            idx = {"pad": _index_subgraph(ib, slot_mapping, block_tables, context_lens, qsl, block_size)}
        else:
            idx = _mixed_index_subgraph(ib, slot_mapping, block_tables, context_lens, qsl, block_size)
        state.emit(ib)
        state.memo[key] = (idx, {})  # masks are reused by later layers: defined before them
    idx, masks = state.memo[key]
    num_kv_heads = attrs["num_kv_heads"]
    wkey = ("paged_attention_write_index", node.input[5], block_size, num_kv_heads)
    if wkey not in state.memo:  # per kv-head count (layers may differ), emitted before its first user
        wb = NodeBuilder(f"/model/paged_attention_write_index_kvh{num_kv_heads}")
        state.memo[wkey] = _write_index(wb, node.input[5], block_size, num_kv_heads)
        state.emit(wb)
    b = NodeBuilder(node.name or node.op_type)
    a = _attention_prologue(b, node, attrs, state.memo[wkey], kv_dtype)
    out = node.output[0]
    if mode == "decode":
        _decode_attention(b, a, a.q, idx["dec"], masks, out)
    elif mode == "prefill":
        _padded_attention(b, a, a.q, idx["pad"], masks, out)
    else:
        out_p = _padded_attention(b, a, a.q, idx["pad"], masks, None)
        q_d = b.op("Slice", [a.q, idx["T_p"], idx["T"], b.const([0])], "q_decode_rows")
        out_d = _decode_attention(b, a, q_d, idx["dec"], masks, None)
        b.op("Concat", [out_p, out_d], "rows_in_order", axis=0, outputs=[out])
    state.emit(b)


def _write_index(b: NodeBuilder, slot_mapping: str, block_size: int, num_kv_heads: int) -> str:
    """``[T, KVH, 3]`` (kv head, block, offset) of each token's slot in every kv head: the
    ScatterND indices of the KV write into the head-major pool ``[KVH, NB, BS, D]``, ordered so
    that the updates are this step's K/V rows as they come, ``[T, KVH, D]`` (no transpose)."""
    c1 = b.const([1])
    bs = b.const(block_size, hint="block_size")
    blk = b.op("Unsqueeze", [b.op("Div", [slot_mapping, bs], "slot_block"), c1])  # [T, 1]
    off = b.op("Unsqueeze", [b.op("Mod", [slot_mapping, bs], "slot_offset"), c1])  # [T, 1]
    blk_off = b.op("Unsqueeze", [b.op("Concat", [blk, off], "slot_block_offset", axis=1), c1])  # [T, 1, 2]
    heads = b.const(np.arange(num_kv_heads, dtype=np.int64).reshape(1, num_kv_heads, 1), hint="kv_heads")
    t_shape = b.op("Shape", [slot_mapping], "T_write")  # [1]
    shape = b.op("Concat", [t_shape, b.const([num_kv_heads, 1])], "kv_head_index_shape", axis=0)
    head_idx = b.op("Expand", [heads, shape], "kv_head_index")  # [T, KVH, 1]
    shape2 = b.op("Concat", [t_shape, b.const([num_kv_heads, 2])], axis=0)
    return b.op("Concat", [head_idx, b.op("Expand", [blk_off, shape2])], "write_idx", axis=2)


def _key_positions(b: NodeBuilder, block_tables: str, block_size: int) -> tuple[str, str]:
    """``(L [1], key_pos [L])``: the key length of a padded block-table row and its positions."""
    mb = b.op("Gather", [b.op("Shape", [block_tables]), b.const([1])], "MB")  # [1]
    L = b.op("Mul", [mb, b.const([block_size])], "L")  # [1]
    return L, b.op("Range", [b.const(0), b.op("Squeeze", [L]), b.const(1)], "key_pos")


def _index_subgraph(
    b: NodeBuilder,
    slot_mapping: str,
    block_tables: str,
    context_lens: str,
    qsl: str,
    block_size: int,
    num_rows: str | None = None,
) -> dict[str, str]:
    """Index tensors of the padded path, shared by every PagedAttention node of a graph.

    ``num_rows`` ([1] int64): only the first ``num_rows`` rows take this path (mixed mode;
    their tokens are the first ``query_start_loc[num_rows]``); None = every row.
    """
    c0, c1 = b.const([0]), b.const([1])
    cmax = b.const([np.iinfo(np.int64).max])
    S_all = b.op("Gather", [b.op("Shape", [block_tables]), c0], "S")  # [1]
    S = num_rows or S_all
    starts = b.op("Slice", [qsl, c0, S], "q_starts")  # [Sp]
    ends = b.op("Slice", [qsl, c1, b.op("Add", [S, c1])], "q_ends")  # [Sp]
    qlen = b.op("Sub", [ends, starts], "q_len")  # [Sp]
    all_qlen = b.op("Sub", [b.op("Slice", [qsl, c1, cmax]), b.op("Slice", [qsl, c0, b.const([-1])])])
    qmax = b.op("ReduceMax", [all_qlen], "q_max", keepdims=1)  # [1]; >= every row's q_len
    qmax_s = b.op("Squeeze", [qmax], "q_max_scalar")
    zero, one = b.const(0), b.const(1)
    num_tokens = b.op("Squeeze", [b.op("Shape", [slot_mapping], "T")], "T_scalar")
    tokens_p = b.op("Squeeze", [b.op("Gather", [qsl, S])], "T_p_scalar")  # tokens of these rows
    t = b.op("Range", [zero, tokens_p, one], "token_index")  # [Tp]
    # seq_of_token[t] = #{s : ends[s] <= t}
    ge = b.op("GreaterOrEqual", [b.op("Unsqueeze", [t, c1]), b.op("Unsqueeze", [ends, c0])], "t_ge_end")  # [Tp, Sp]
    seq_of_t = b.op("ReduceSum", [b.op("Cast", [ge], to=TensorProto.INT64), c1], "seq_of_token", keepdims=0)
    off_in_chunk = b.op("Sub", [t, b.op("Gather", [starts, seq_of_t], axis=0)], "offset_in_chunk")
    pad_index = b.op("Add", [b.op("Mul", [seq_of_t, qmax_s]), off_in_chunk], "pad_index")  # [Tp]
    # padded rows -> token index (clamped for padding rows, whose outputs are discarded)
    i = b.op("Range", [zero, qmax_s, one], "q_row")  # [Qmax]
    tok = b.op("Add", [b.op("Unsqueeze", [starts, c1]), b.op("Unsqueeze", [i, c0])], "pad_token")  # [Sp, Qmax]
    tok = b.op("Min", [tok, b.op("Sub", [num_tokens, one])], "pad_token_clamped")
    tok_flat = b.op("Reshape", [tok, b.const([-1])], "pad_token_flat")  # [Sp*Qmax]
    # query positions [Sp, Qmax]
    base = b.op("Sub", [b.op("Slice", [context_lens, c0, S]), qlen], "chunk_start_pos")
    qpos = b.op("Add", [b.op("Unsqueeze", [base, c1]), b.op("Unsqueeze", [i, c0])], "q_pos")
    L, j = _key_positions(b, block_tables, block_size)
    qpos3 = b.op("Unsqueeze", [qpos, b.const([2])])  # [Sp, Qmax, 1]
    causal = b.op("LessOrEqual", [j, qpos3], "causal")  # [Sp, Qmax, L]
    rows = block_tables if num_rows is None else b.op("Slice", [block_tables, c0, S, c0], "block_tables_padded")
    return dict(
        pad_index=pad_index,
        tok_flat=tok_flat,
        qpos3=qpos3,
        key_pos=j,
        causal=causal,
        qmax=qmax,
        L=L,
        S=S,
        block_tables=rows,
    )


def _decode_index_subgraph(
    b: NodeBuilder,
    slot_mapping: str,
    block_tables: str,
    context_lens: str,
    block_size: int,
    first_row: str | None = None,
) -> dict[str, str]:
    """Decode path: one query per row at position context_lens - 1 (shared by all layers).

    ``first_row`` ([1] int64): only rows from ``first_row`` on take this path (mixed mode);
    None = every row.
    """
    c0, c1 = b.const([0]), b.const([1])
    rows, ctx_lens = block_tables, context_lens
    if first_row is not None:
        cmax = b.const([np.iinfo(np.int64).max])
        rows = b.op("Slice", [block_tables, first_row, cmax, c0], "block_tables_decode")
        ctx_lens = b.op("Slice", [context_lens, first_row, cmax, c0], "context_lens_decode")
    L, j = _key_positions(b, block_tables, block_size)
    ctx = b.op("Unsqueeze", [ctx_lens, c1], "ctx_2d")  # [Sd, 1]
    causal = b.op("Less", [j, ctx], "causal")  # [Sd, L]: j <= pos = ctx - 1
    S = b.op("Gather", [b.op("Shape", [rows]), c0], "S_decode")  # [1]
    return dict(key_pos=j, ctx=ctx, causal=causal, L=L, S=S, block_tables=rows)


def _mixed_index_subgraph(
    b: NodeBuilder, slot_mapping: str, block_tables: str, context_lens: str, qsl: str, block_size: int
) -> dict[str, Any]:
    """Both paths' index tensors: rows ``[0, S_p)`` padded, the trailing 1-token rows decode.

    ``S_p = S - #trailing rows with q_len == 1`` (reverse CumSum of ``q_len != 1`` is 0 exactly
    on the trailing run); ``T_p = query_start_loc[S_p]``, the first decode row's token.
    """
    c0, c1 = b.const([0]), b.const([1])
    qlen = b.op(
        "Sub", [b.op("Slice", [qsl, c1, b.const([np.iinfo(np.int64).max])]), b.op("Slice", [qsl, c0, b.const([-1])])]
    )
    not_one = b.op("Cast", [b.op("Not", [b.op("Equal", [qlen, b.const(1)])])], to=TensorProto.INT64)
    trailing = b.op("Equal", [b.op("CumSum", [not_one, b.const(0)], reverse=1), b.const(0)], "trailing_one_token_rows")
    num_decode = b.op("ReduceSum", [b.op("Cast", [trailing], to=TensorProto.INT64), c0], keepdims=1)  # [1]
    S_all = b.op("Gather", [b.op("Shape", [block_tables]), c0], "S_all")  # [1]
    S_p = b.op("Sub", [S_all, num_decode], "S_padded")  # [1]
    pad = _index_subgraph(b, slot_mapping, block_tables, context_lens, qsl, block_size, num_rows=S_p)
    dec = _decode_index_subgraph(b, slot_mapping, block_tables, context_lens, block_size, first_row=S_p)
    T_p = b.op("Gather", [qsl, S_p], "T_p")  # [1]
    T = b.op("Shape", [slot_mapping], "T_all")  # [1]
    return {"pad": pad, "dec": dec, "T_p": T_p, "T": T}


@dataclass(frozen=True)
class _Head:
    """One PagedAttention node's attributes and tensor names (after the KV write)."""

    H: int
    KVH: int
    D: int
    G: int
    W: int
    scale: float
    q: str
    kc: str  # the pool after this step's write (ScatterND output = the node's present_key)
    vc: str
    kv_dtype: str  # fp32 | fp16 | bf16 | int8
    ks: str = ""  # int8: the scales after this step's write ([KVH, NB, BS] float32)
    vs: str = ""


def _attention_prologue(
    b: NodeBuilder, node: onnx.NodeProto, a: dict[str, Any], write_idx: str, kv_dtype: str
) -> _Head:
    """Take the node's attributes ``a`` (:func:`node_attributes`), check GQA, and write this
    step's K/V, encoded in ``kv_dtype``, into the pool in place (ScatterND at ``write_idx
    [T, KVH, 3]`` with updates ``[T, KVH, D]``, and ``[T, KVH]`` int8 scales, for every token of
    the batch; see the module docstring)."""
    H, KVH, D = a["num_heads"], a["num_kv_heads"], a["head_size"]
    W = a.get("sliding_window", 0)
    scale = a.get("scale", 0.0) or 1.0 / float(np.sqrt(D))
    if H % KVH:
        raise OpError(f"PagedAttention {node.name}: num_heads {H} is not a multiple of num_kv_heads {KVH}")
    q, k, v, kc, vc = node.input[:5]
    kc_out, vc_out = node.output[1:3]
    T_kvh_d = b.const([-1, KVH, D])
    scaled = kv_dtype == "int8"
    if scaled and (len(node.input) < 11 or len(node.output) < 5):
        raise OpError(f"PagedAttention {node.name}: an int8 pool needs key_scale/value_scale inputs and outputs")
    scales_out = []
    for x, cache, cache_out, hint in ((k, kc, kc_out, "k"), (v, vc, vc_out, "v")):
        rows = b.op("Reshape", [x, T_kvh_d], f"{hint}_rows")  # [T, KVH, D]
        codes, sc = _encode(b, rows, kv_dtype, hint)
        b.op("ScatterND", [cache, write_idx, codes], f"write_{hint}", outputs=[cache_out])
        if scaled:
            i = 9 if hint == "k" else 10
            b.op("ScatterND", [node.input[i], write_idx, sc], f"write_{hint}_scale", outputs=[node.output[i - 6]])
            scales_out.append(node.output[i - 6])
    return _Head(H, KVH, D, H // KVH, W, scale, q, kc_out, vc_out, kv_dtype, *scales_out)


def _encode(b: NodeBuilder, rows: str, kv_dtype: str, hint: str) -> tuple[str, str]:
    """``rows [T, KVH, D]`` float32 as the pool stores them: ``(codes, scales [T, KVH] | "")``
    (kv_codec.kv_encode: Cast rounds to nearest even; int8 ``rint(x * (127 / amax))`` clipped,
    scale ``amax / 127``, both 0 for an all-zero row)."""
    if kv_dtype in ("fp16", "bf16"):
        return b.op("Cast", [rows], f"{hint}_{kv_dtype}", to=DTYPES[kv_dtype].onnx_type), ""
    if kv_dtype != "int8":
        return rows, ""
    amax = b.op("ReduceMax", [b.op("Abs", [rows]), b.const([-1])], f"{hint}_amax", keepdims=1)  # [T, KVH, 1]
    f0 = b.const(0.0, np.float32)
    inv = b.op("Where", [b.op("Greater", [amax, f0]), b.op("Div", [b.const(127.0, np.float32), amax]), f0])
    q = b.op(
        "Clip", [b.op("Round", [b.op("Mul", [rows, inv])]), b.const(-127.0, np.float32), b.const(127.0, np.float32)]
    )
    codes = b.op("Cast", [q], f"{hint}_int8", to=TensorProto.INT8)
    sc = b.op("Div", [b.op("Squeeze", [amax, b.const([-1])]), b.const(127.0, np.float32)], f"{hint}_scale")
    return codes, sc


def _shape(b: NodeBuilder, shared: dict, *parts: Any) -> str:
    """A shape tensor from ``[1]``-shaped names and ints (spelled out: zero-sized rows allowed),
    built by the first layer that needs it and reused by the later ones (``shared``)."""
    key = ("shape", *parts)
    if key not in shared:
        shared[key] = b.op("Concat", [p if isinstance(p, str) else b.const([p]) for p in parts], "shape", axis=0)
    return shared[key]


def _keys_values(b: NodeBuilder, a: _Head, idx: dict[str, str], shared: dict) -> tuple[str, str]:
    """``(k_t [KVH, S, D, L], v [KVH, S, L, D])`` of the path's rows: one Gather along the pool's
    block axis (``[KVH, S, MB, BS, D]``) and a reshape; ``k_t`` is a last-two-axes Transpose
    that ONNX Runtime folds into its MatMul (``FusedMatMul`` transB), so no copy."""
    kvh_s_l_d = _shape(b, shared, a.KVH, idx["S"], idx["L"], a.D)
    out = []
    for cache, sc, hint in ((a.kc, a.ks, "k"), (a.vc, a.vs, "v")):
        x = b.op("Reshape", [b.op("Gather", [cache, idx["block_tables"]], f"gather_{hint}", axis=1), kvh_s_l_d])
        if a.kv_dtype != "fp32":  # decode (kv_codec.kv_decode): the pool's codes as float32
            x = b.op("Cast", [x], f"{hint}_float", to=TensorProto.FLOAT)
        if sc:  # int8: times the token-head scales, [KVH, S, L, 1]
            g = b.op("Gather", [sc, idx["block_tables"]], f"gather_{hint}_scale", axis=1)
            x = b.op("Mul", [x, b.op("Reshape", [g, _shape(b, shared, a.KVH, idx["S"], idx["L"], 1)])])
        out.append(x)
    return b.op("Transpose", [out[0]], "k_t", perm=[0, 1, 3, 2]), out[1]


def _padded_attention(b: NodeBuilder, a: _Head, q: str, idx: dict[str, str], masks: dict, out: str | None) -> str:
    """Packed queries -> padded ``[KVH, S, G*Qmax, D]`` -> attention -> packed ``[T, H*D]``."""
    KVH, G, D = a.KVH, a.G, a.D
    if ("pad", a.W) not in masks:  # shared by the layers with the same window
        m = idx["causal"]
        if a.W > 0:
            lo = b.op("Sub", [idx["qpos3"], b.const(a.W)])
            m = b.op("And", [m, b.op("Greater", [idx["key_pos"], lo], "in_window")], f"mask_w{a.W}")
        masks[("pad", a.W)] = b.op("Unsqueeze", [m, b.const([0, 2])], f"mask5d_w{a.W}")  # [1, S, 1, Qmax, L]
    kt, vs = _keys_values(b, a, idx, masks)
    S, qmax, L = idx["S"], idx["qmax"], idx["L"]
    if ("g_times_qmax", G) not in masks:
        masks[("g_times_qmax", G)] = b.op("Mul", [qmax, b.const([G])], "g_times_qmax")
    gq = masks[("g_times_qmax", G)]
    qs = b.op("Mul", [q, b.const(a.scale, np.float32)], "q_scaled")
    qp = b.op("Gather", [qs, idx["tok_flat"]], "q_pad", axis=0)
    qp = b.op("Reshape", [qp, _shape(b, masks, S, qmax, KVH, G, D)])
    qp = b.op("Transpose", [qp], "q_t", perm=[2, 0, 3, 1, 4])  # [KVH, S, G, Qmax, D]
    qp = b.op("Reshape", [qp, _shape(b, masks, KVH, S, gq, D)])
    scores = b.op("MatMul", [qp, kt], "scores")  # [KVH, S, G*Qmax, L]
    sc5 = b.op("Reshape", [scores, _shape(b, masks, KVH, S, G, qmax, L)])
    sc5 = b.op("Where", [masks[("pad", a.W)], sc5, b.const(-np.inf, np.float32)], "masked_scores")
    probs = b.op("Softmax", [sc5], "probs", axis=-1)
    probs = b.op("Reshape", [probs, _shape(b, masks, KVH, S, gq, L)])
    o = b.op("MatMul", [probs, vs], "attn")  # [KVH, S, G*Qmax, D]
    o = b.op("Reshape", [o, _shape(b, masks, KVH, S, G, qmax, D)])
    o = b.op("Transpose", [o], "o_t", perm=[1, 3, 0, 2, 4])  # [S, Qmax, KVH, G, D]
    o = b.op("Reshape", [o, b.const([-1, a.H * D])])
    return b.op("Gather", [o, idx["pad_index"]], "unpad", axis=0, outputs=[out] if out else None)


def _decode_attention(b: NodeBuilder, a: _Head, q: str, idx: dict[str, str], masks: dict, out: str | None) -> str:
    """One query token per row: scores ``[KVH, S, G, L]`` without any padding or re-packing."""
    if ("dec", a.W) not in masks:
        m = idx["causal"]
        if a.W > 0:  # j > pos - W  <=>  j >= ctx - W
            lo = b.op("Sub", [idx["ctx"], b.const(a.W)])
            m = b.op("And", [m, b.op("GreaterOrEqual", [idx["key_pos"], lo])], f"mask_w{a.W}")
        masks[("dec", a.W)] = b.op("Unsqueeze", [m, b.const([0, 2])], f"mask4d_w{a.W}")  # [1, S, 1, L]
    kt, vs = _keys_values(b, a, idx, masks)
    qs = b.op("Reshape", [b.op("Mul", [q, b.const(a.scale, np.float32)], "q_scaled"), b.const([-1, a.KVH, a.G, a.D])])
    qs = b.op("Transpose", [qs], "q_t", perm=[1, 0, 2, 3])  # [KVH, S, G, D]
    scores = b.op("MatMul", [qs, kt], "scores")  # [KVH, S, G, L]
    scores = b.op("Where", [masks[("dec", a.W)], scores, b.const(-np.inf, np.float32)], "masked_scores")
    probs = b.op("Softmax", [scores], "probs", axis=-1)
    o = b.op("MatMul", [probs, vs], "attn")  # [KVH, S, G, D]
    o = b.op("Transpose", [o], "o_t", perm=[1, 0, 2, 3])  # [S, KVH, G, D]
    return b.op("Reshape", [o, b.const([-1, a.H * a.D])], "attn_flat", outputs=[out] if out else None)
