"""``trtpipe::PagedAttention`` in standard ONNX ops, shared by the ONNX Runtime lowering and
TensorRT's plugin-free lowering (:func:`lower_paged_attention`).

1. write: ``ScatterND(key_cache, [block, offset], key)`` whose output is the graph's
   ``present_*`` output. ONNX Runtime binds ``past_*`` and ``present_*`` to the same buffer
   (IOBinding) and its ScatterND skips the input copy when source and target are the same
   memory, so KV is written once per token (TensorRT's ScatterND writes a new tensor instead).
2. read: ``Gather(cache, block_tables)`` -> per-sequence keys ``[S, MB*BS, KVH, D]``; prefill
   queries are gathered into a padded ``[S, Qmax]`` layout (decode: one query per sequence, no
   padding); GQA is a reshape ``[S, KVH, G*Qmax, D]``; causal + window mask by ``Where``;
   ``Softmax``; ``MatMul``; prefill gathers back to packed tokens.

Index tensors derived from ``slot_mapping``, ``block_tables``, ``context_lens`` and
``query_start_loc`` are built once per graph (``GraphRewrite.memo``) and shared by all layers;
masks are shared by the layers with the same window.

Pool layout (per layer, K and V alike)::

    cache[NB, BS, KVH, D]   block 0 = null block
      slot = block_id * BS + position % BS  ->  (slot // BS, slot % BS)

Meaning: :func:`trtpipe.plugins.reference.paged_attention` (tests compare both lowerings to it).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from trtpipe.plugins.errors import OpError
from trtpipe.plugins.graph_rewrite import GraphRewrite, NodeBuilder, node_attributes

__all__ = ["lower_paged_attention"]


def lower_paged_attention(node: onnx.NodeProto, state: GraphRewrite, *, decode: bool) -> None:
    """Rewrite one ``PagedAttention`` node into standard ops appended to ``state``.

    ``decode``: one query token per sequence (``query_start_loc`` = 0..S): no padded query
    layout. The index subgraph of the node's (slot_mapping, block_tables, context_lens,
    query_start_loc, block_size) is emitted once, before the first layer reading it, under
    ``/model/paged_attention_index``. Raises :class:`OpError` when num_heads is not a multiple
    of num_kv_heads.
    """
    block_size = node_attributes(node)["block_size"]
    key = ("paged_attention_index", tuple(node.input[5:9]), block_size)
    if key not in state.memo:
        ib = NodeBuilder("/model/paged_attention_index")
        slot_mapping, block_tables, context_lens, qsl = node.input[5:9]
        if decode:
            idx = _decode_index_subgraph(ib, slot_mapping, block_tables, context_lens, block_size=block_size)
        else:
            idx = _index_subgraph(ib, slot_mapping, block_tables, context_lens, qsl, block_size=block_size)
        state.emit(ib)
        state.memo[key] = (idx, {})  # masks are reused by later layers: defined before them
    idx, masks = state.memo[key]
    b = NodeBuilder(node.name or node.op_type)
    (_lower_paged_attention_decode if decode else _lower_paged_attention)(b, node, idx, masks)
    state.emit(b)


def _index_subgraph(
    b: NodeBuilder, slot_mapping: str, block_tables: str, context_lens: str, qsl: str, block_size: int
) -> dict[str, str]:
    """Index tensors shared by every PagedAttention node of a graph (see module docstring)."""
    c0, c1 = b.const([0]), b.const([1])
    cmax = b.const([np.iinfo(np.int64).max])
    bs = b.const(block_size, hint="block_size")
    blk = b.op("Div", [slot_mapping, bs], "slot_block")
    off = b.op("Mod", [slot_mapping, bs], "slot_offset")
    write_idx = b.op("Concat", [b.op("Unsqueeze", [blk, c1]), b.op("Unsqueeze", [off, c1])], "write_idx", axis=1)
    starts = b.op("Slice", [qsl, c0, b.const([-1])], "q_starts")  # [S]
    ends = b.op("Slice", [qsl, c1, cmax], "q_ends")  # [S]
    qlen = b.op("Sub", [ends, starts], "q_len")  # [S]
    qmax = b.op("ReduceMax", [qlen], "q_max", keepdims=1)  # [1]
    qmax_s = b.op("Squeeze", [qmax], "q_max_scalar")
    zero, one = b.const(0), b.const(1)
    num_tokens = b.op("Squeeze", [b.op("Shape", [slot_mapping], "T")], "T_scalar")
    t = b.op("Range", [zero, num_tokens, one], "token_index")  # [T]
    # seq_of_token[t] = #{s : ends[s] <= t}
    ge = b.op("GreaterOrEqual", [b.op("Unsqueeze", [t, c1]), b.op("Unsqueeze", [ends, c0])], "t_ge_end")  # [T, S]
    seq_of_t = b.op("ReduceSum", [b.op("Cast", [ge], to=TensorProto.INT64), c1], "seq_of_token", keepdims=0)
    off_in_chunk = b.op("Sub", [t, b.op("Gather", [starts, seq_of_t], axis=0)], "offset_in_chunk")
    pad_index = b.op("Add", [b.op("Mul", [seq_of_t, qmax_s]), off_in_chunk], "pad_index")  # [T]
    # padded rows -> token index (clamped for padding rows, whose outputs are discarded)
    i = b.op("Range", [zero, qmax_s, one], "q_row")  # [Qmax]
    tok = b.op("Add", [b.op("Unsqueeze", [starts, c1]), b.op("Unsqueeze", [i, c0])], "pad_token")  # [S, Qmax]
    last_tok = b.op("Sub", [num_tokens, one])
    tok = b.op("Min", [tok, last_tok], "pad_token_clamped")
    tok_flat = b.op("Reshape", [tok, b.const([-1])], "pad_token_flat")  # [S*Qmax]
    # query positions [S, Qmax]
    base = b.op("Sub", [context_lens, qlen], "chunk_start_pos")
    qpos = b.op("Add", [b.op("Unsqueeze", [base, c1]), b.op("Unsqueeze", [i, c0])], "q_pos")
    mb = b.op("Gather", [b.op("Shape", [block_tables]), c1], "MB")  # [1]
    L = b.op("Mul", [mb, b.const([block_size])], "L")  # [1]
    j = b.op("Range", [zero, b.op("Squeeze", [L]), one], "key_pos")  # [L]
    qpos3 = b.op("Unsqueeze", [qpos, b.const([2])])  # [S, Qmax, 1]
    causal = b.op("LessOrEqual", [j, qpos3], "causal")  # [S, Qmax, L]
    return dict(
        write_idx=write_idx,
        pad_index=pad_index,
        tok_flat=tok_flat,
        qpos3=qpos3,
        key_pos=j,
        causal=causal,
        qmax=qmax,
        L=L,
    )


def _attention_prologue(b: NodeBuilder, node: onnx.NodeProto, idx: dict[str, str]):
    """Shared by the prefill and decode lowerings: read the attributes, check GQA, and write this
    step's K/V into the pool in place (ScatterND at ``write_idx``; see the module docstring)."""
    a = node_attributes(node)
    H, KVH, D = a["num_heads"], a["num_kv_heads"], a["head_size"]
    W = a.get("sliding_window", 0)
    scale = a.get("scale", 0.0) or 1.0 / float(np.sqrt(D))
    if H % KVH:
        raise OpError(f"PagedAttention {node.name}: num_heads {H} is not a multiple of num_kv_heads {KVH}")
    q, k, v, kc, vc, _slot, block_tables = node.input[:7]
    out, kc_out, vc_out = node.output
    T_kvh_d = b.const([-1, KVH, D])
    b.op("ScatterND", [kc, idx["write_idx"], b.op("Reshape", [k, T_kvh_d])], "write_k", outputs=[kc_out])
    b.op("ScatterND", [vc, idx["write_idx"], b.op("Reshape", [v, T_kvh_d])], "write_v", outputs=[vc_out])
    return H, KVH, D, H // KVH, W, scale, q, block_tables, out, kc_out, vc_out


def _lower_paged_attention(b: NodeBuilder, node: onnx.NodeProto, idx: dict[str, str], masks: dict) -> None:
    H, KVH, D, G, W, scale, q, block_tables, out, kc_out, vc_out = _attention_prologue(b, node, idx)
    # mask (shared by layers with the same window)
    if W not in masks:
        if W > 0:
            lo = b.op("Sub", [idx["qpos3"], b.const(W)])
            in_win = b.op("Greater", [idx["key_pos"], lo], "in_window")
            m = b.op("And", [idx["causal"], in_win], f"mask_w{W}")
        else:
            m = idx["causal"]
        masks[W] = b.op("Unsqueeze", [m, b.const([1, 2])], f"mask5d_w{W}")  # [S, 1, 1, Qmax, L]
    mask = masks[W]
    # keys/values per sequence: [S, MB, BS, KVH, D] -> [S, L, KVH, D]
    s_l_kvh_d = b.const([0, -1, KVH, D])
    ks = b.op("Reshape", [b.op("Gather", [kc_out, block_tables], "gather_k", axis=0), s_l_kvh_d])
    vs = b.op("Reshape", [b.op("Gather", [vc_out, block_tables], "gather_v", axis=0), s_l_kvh_d])
    kt = b.op("Transpose", [ks], "k_t", perm=[0, 2, 3, 1])  # [S, KVH, D, L]
    vt = b.op("Transpose", [vs], "v_t", perm=[0, 2, 1, 3])  # [S, KVH, L, D]
    # queries: packed [T, H*D] -> padded [S, Qmax, KVH, G, D] -> [S, KVH, G*Qmax, D]
    qs = b.op("Mul", [q, b.const(scale, np.float32)], "q_scaled")
    qp = b.op("Gather", [qs, idx["tok_flat"]], "q_pad", axis=0)
    S_ = b.op("Gather", [b.op("Shape", [block_tables]), b.const([0])], "S")
    qp = b.op("Reshape", [qp, b.op("Concat", [S_, idx["qmax"], b.const([KVH, G, D])], axis=0)])
    qp = b.op("Transpose", [qp], "q_t", perm=[0, 2, 3, 1, 4])  # [S, KVH, G, Qmax, D]
    qp = b.op("Reshape", [qp, b.const([0, KVH, -1, D])])
    scores = b.op("MatMul", [qp, kt], "scores")  # [S, KVH, G*Qmax, L]
    sc5 = b.op("Reshape", [scores, b.op("Concat", [S_, b.const([KVH, G]), idx["qmax"], idx["L"]], axis=0)])
    sc5 = b.op("Where", [mask, sc5, b.const(-np.inf, np.float32)], "masked_scores")
    probs = b.op("Softmax", [sc5], "probs", axis=-1)
    probs = b.op("Reshape", [probs, b.op("Concat", [S_, b.const([KVH, -1]), idx["L"]], axis=0)])
    o = b.op("MatMul", [probs, vt], "attn")  # [S, KVH, G*Qmax, D]
    o = b.op("Reshape", [o, b.op("Concat", [S_, b.const([KVH, G]), idx["qmax"], b.const([D])], axis=0)])
    o = b.op("Transpose", [o], "o_t", perm=[0, 3, 1, 2, 4])  # [S, Qmax, KVH, G, D]
    o = b.op("Reshape", [o, b.const([-1, H * D])])
    b.op("Gather", [o, idx["pad_index"]], "unpad", axis=0, outputs=[out])


def _decode_index_subgraph(
    b: NodeBuilder, slot_mapping: str, block_tables: str, context_lens: str, block_size: int
) -> dict[str, str]:
    """Decode: one query per sequence at position context_lens - 1 (shared by all layers)."""
    c1 = b.const([1])
    bs = b.const(block_size, hint="block_size")
    blk = b.op("Div", [slot_mapping, bs], "slot_block")
    off = b.op("Mod", [slot_mapping, bs], "slot_offset")
    write_idx = b.op("Concat", [b.op("Unsqueeze", [blk, c1]), b.op("Unsqueeze", [off, c1])], "write_idx", axis=1)
    mb = b.op("Gather", [b.op("Shape", [block_tables]), c1], "MB")
    L = b.op("Squeeze", [b.op("Mul", [mb, b.const([block_size])], "L")])
    j = b.op("Range", [b.const(0), L, b.const(1)], "key_pos")  # [L]
    ctx = b.op("Unsqueeze", [context_lens, c1], "ctx_2d")  # [S, 1]
    causal = b.op("Less", [j, ctx], "causal")  # [S, L]: j <= pos = ctx - 1
    return dict(write_idx=write_idx, key_pos=j, ctx=ctx, causal=causal)


def _lower_paged_attention_decode(b: NodeBuilder, node: onnx.NodeProto, idx: dict[str, str], masks: dict) -> None:
    """One query token per sequence: scores [S, KVH, G, L] without any padding or re-packing."""
    H, KVH, D, G, W, scale, q, block_tables, out, kc_out, vc_out = _attention_prologue(b, node, idx)
    if W not in masks:
        m = idx["causal"]
        if W > 0:  # j > pos - W  <=>  j >= ctx - W
            lo = b.op("Sub", [idx["ctx"], b.const(W)])
            m = b.op("And", [m, b.op("GreaterOrEqual", [idx["key_pos"], lo])], f"mask_w{W}")
        masks[W] = b.op("Unsqueeze", [m, b.const([1, 2])], f"mask4d_w{W}")  # [S, 1, 1, L]
    s_l_kvh_d = b.const([0, -1, KVH, D])
    kt = b.op(
        "Transpose",
        [b.op("Reshape", [b.op("Gather", [kc_out, block_tables], "gather_k", axis=0), s_l_kvh_d])],
        "k_t",
        perm=[0, 2, 3, 1],
    )  # [S, KVH, D, L]
    vt = b.op(
        "Transpose",
        [b.op("Reshape", [b.op("Gather", [vc_out, block_tables], "gather_v", axis=0), s_l_kvh_d])],
        "v_t",
        perm=[0, 2, 1, 3],
    )  # [S, KVH, L, D]
    qs = b.op("Reshape", [b.op("Mul", [q, b.const(scale, np.float32)], "q_scaled"), b.const([-1, KVH, G, D])])
    scores = b.op("MatMul", [qs, kt], "scores")  # [S, KVH, G, L]
    scores = b.op("Where", [masks[W], scores, b.const(-np.inf, np.float32)], "masked_scores")
    probs = b.op("Softmax", [scores], "probs", axis=-1)
    o = b.op("MatMul", [probs, vt], "attn")  # [S, KVH, G, D]
    b.op("Reshape", [o, b.const([-1, H * D])], "attn_flat", outputs=[out])
