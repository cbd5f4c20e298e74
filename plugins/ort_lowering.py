"""Lower ``trtpipe`` custom nodes to ops that ONNX Runtime runs natively on CPU.

* ``Int4Gemm`` -> ``com.microsoft::MatMulNBits`` (same packing; TOOLCHAIN.md), with an
  ``accuracy_level`` chosen by the caller (4 = int8 activations: faster, ~5e-3 relative error).
* ``PagedAttention`` -> standard ONNX ops over the pool:

  1. write: ``ScatterND(key_cache, [block, offset], key)`` whose output is the graph's
     ``present_*`` output. The runtime binds ``past_*`` and ``present_*`` to the same buffer
     (IOBinding), and ONNX Runtime's ScatterND skips its input copy when source and target are the
     same memory, so KV is written once per token and the pool is never copied.
  2. read: ``Gather(cache, block_tables)`` -> per-sequence keys ``[S, MB*BS, KVH, D]``; queries are
     gathered into a padded ``[S, Qmax]`` layout; GQA is a reshape ``[S, KVH, G*Qmax, D]``;
     causal + window mask by ``Where``; ``Softmax``; ``MatMul``; gather back to packed tokens.

  Index tensors derived from ``slot_mapping``, ``block_tables``, ``context_lens`` and
  ``query_start_loc`` are built once per graph and shared by all layers.

Pool layout (per layer, K and V alike)::

    cache[NB, BS, KVH, D]   block 0 = null block
      slot = block_id * BS + position % BS  ->  (slot // BS, slot % BS)

Passes are functions ``ModelProto -> ModelProto`` and idempotent (a lowered graph has no
``trtpipe`` nodes left to rewrite).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtpipe.plugins import OP_DOMAIN
from trtpipe.plugins.errors import OpError

MS_DOMAIN = "com.microsoft"


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Builder:
    """Appends nodes with unique, stable names under a prefix."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{self.prefix}/{hint}_{self._n}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, n_out: int = 1,
           domain: str = "", outputs: list[str] | None = None, **attrs) -> str | list[str]:
        nm = self.name(hint or op_type)
        outs = outputs or [f"{nm}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=nm, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=np.int64, hint: str = "c") -> str:
        nm = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), nm))
        return nm


def _index_subgraph(b: _Builder, slot_mapping: str, block_tables: str, context_lens: str, qsl: str,
                    block_size: int) -> dict[str, str]:
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
    return dict(write_idx=write_idx, pad_index=pad_index, tok_flat=tok_flat, qpos3=qpos3, key_pos=j,
                causal=causal, qmax=qmax, L=L)


def _attention_prologue(b: _Builder, node: onnx.NodeProto, idx: dict[str, str]):
    """Shared by the prefill and decode lowerings: read the attributes, check GQA, and write this
    step's K/V into the pool in place (ScatterND at ``write_idx``; see the module docstring)."""
    a = _attrs(node)
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


def _lower_paged_attention(b: _Builder, node: onnx.NodeProto, idx: dict[str, str], masks: dict) -> None:
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


def _decode_index_subgraph(b: _Builder, slot_mapping: str, block_tables: str, context_lens: str,
                           block_size: int) -> dict[str, str]:
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


def _lower_paged_attention_decode(b: _Builder, node: onnx.NodeProto, idx: dict[str, str], masks: dict) -> None:
    """One query token per sequence: scores [S, KVH, G, L] without any padding or re-packing."""
    H, KVH, D, G, W, scale, q, block_tables, out, kc_out, vc_out = _attention_prologue(b, node, idx)
    if W not in masks:
        m = idx["causal"]
        if W > 0:  # j > pos - W  <=>  j >= ctx - W
            lo = b.op("Sub", [idx["ctx"], b.const(W)])
            m = b.op("And", [m, b.op("GreaterOrEqual", [idx["key_pos"], lo])], f"mask_w{W}")
        masks[W] = b.op("Unsqueeze", [m, b.const([1, 2])], f"mask4d_w{W}")  # [S, 1, 1, L]
    s_l_kvh_d = b.const([0, -1, KVH, D])
    kt = b.op("Transpose", [b.op("Reshape", [b.op("Gather", [kc_out, block_tables], "gather_k", axis=0), s_l_kvh_d])],
              "k_t", perm=[0, 2, 3, 1])  # [S, KVH, D, L]
    vt = b.op("Transpose", [b.op("Reshape", [b.op("Gather", [vc_out, block_tables], "gather_v", axis=0), s_l_kvh_d])],
              "v_t", perm=[0, 2, 1, 3])  # [S, KVH, L, D]
    qs = b.op("Reshape", [b.op("Mul", [q, b.const(scale, np.float32)], "q_scaled"), b.const([-1, KVH, G, D])])
    scores = b.op("MatMul", [qs, kt], "scores")  # [S, KVH, G, L]
    scores = b.op("Where", [masks[W], scores, b.const(-np.inf, np.float32)], "masked_scores")
    probs = b.op("Softmax", [scores], "probs", axis=-1)
    o = b.op("MatMul", [probs, vt], "attn")  # [S, KVH, G, D]
    b.op("Reshape", [o, b.const([-1, H * D])], "attn_flat", outputs=[out])


def _lower_int4_gemm(b: _Builder, node: onnx.NodeProto, accuracy_level: int, inits: dict,
                     blocksums: dict, float_zero_points: str = "exact") -> None:
    """Int4Gemm -> MatMulNBits.

    uint8 (or absent) zero points map 1:1. Float zero points (GGUF Q4_1: ``w = d*q + m`` with
    ``zp = -m/d``) make MatMulNBits ~30x slower on CPU (measured: 2.5 ms vs 0.08 ms for a
    576x1536 GEMV), so they are lowered exactly as
    ``Y = MatMulNBits(A, q, d, zp=0) + blocksum(A) @ M^T`` with ``M = -zp * d`` [N, K/G] and
    ``blocksum(A)[.., g] = sum of A over group g`` (shared by linears reading the same A).
    That correction is ~20 % of a SmolLM2 decode step (removing it, timing only: 10.7 -> 8.6 ms
    after a 16-token prompt, 13.8 -> 11.7 ms after 512; docs/benchmarks.md), so with ``float_zero_points="int8"`` the blocks are
    instead re-coded as 8-bit blocks with integer zero points (:func:`~trtpipe.plugins.int4_pack.requantize_float_zp_to_uint8_8bit`: each weight
    moves by at most ``d/32``, no correction term, twice the weight bytes).
    """
    a = _attrs(node)
    K, N, G = a["K"], a["N"], a["group_size"]
    nbits = dict(K=K, N=N, bits=a.get("bits", 4), block_size=G, accuracy_level=accuracy_level)
    inputs = list(node.input)
    zp_name = inputs[3] if len(inputs) > 3 else ""
    zp = inits.get(zp_name) if zp_name else None
    if zp is None or zp.dtype == np.uint8:
        b.op("MatMulNBits", inputs, "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output), **nbits)
        return
    bits = a.get("bits", 4)
    zf = zp.astype(np.float32)
    if np.all(zf == np.round(zf)) and zf.min() >= 0 and zf.max() <= (15 if bits == 4 else 255):
        # integer zero points (Q4_0, RTN, Q8_0): the fast uint8 form, exactly
        z8 = zf.astype(np.uint8)
        if bits == 4:
            z8 = np.concatenate([z8, np.zeros((z8.shape[0], z8.shape[1] % 2), np.uint8)], axis=1)
            z8 = (z8[:, 0::2] | (z8[:, 1::2] << 4)).astype(np.uint8)
        zname = b.const(z8, np.uint8, hint="zero_points_u8")
        b.op("MatMulNBits", inputs[:3] + [zname], "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output), **nbits)
        return
    scales = inits[inputs[2]]
    if float_zero_points == "int8" and bits == 4:
        from trtpipe.plugins.int4_pack import requantize_float_zp_to_uint8_8bit
        from trtpipe.plugins.reference import unpack_int4_codes

        q8, d8, z8 = requantize_float_zp_to_uint8_8bit(unpack_int4_codes(inits[inputs[1]], K, N, G),
                                                       scales, zp, G)
        names = [b.const(q8, np.uint8, hint="b_int8"), b.const(d8, np.float32, hint="scales_int8"),
                 b.const(z8, np.uint8, hint="zero_points_int8")]
        b.op("MatMulNBits", [inputs[0]] + names, "matmul_nbits", domain=MS_DOMAIN, outputs=list(node.output),
             **dict(nbits, bits=8))
        return
    mins_t = np.ascontiguousarray((-zp.astype(np.float32) * scales.astype(np.float32)).T)  # [K/G, N]
    n_groups = K // G
    zero_zp = b.const(np.zeros((N, (n_groups + 1) // 2), np.uint8), np.uint8, hint="zp_zero")
    mins = b.const(mins_t, np.float32, hint="mins_t")
    y = b.op("MatMulNBits", inputs[:3] + [zero_zp], "matmul_nbits", domain=MS_DOMAIN, **nbits)
    key = (inputs[0], G)
    if key not in blocksums:
        r = b.op("Reshape", [inputs[0], b.const([-1, n_groups, G])], "a_groups")
        blocksums[key] = b.op("ReduceSum", [r, b.const([-1])], "a_blocksum", keepdims=0)  # [M, K/G]
    corr = b.op("MatMul", [blocksums[key], mins], "mins_term")
    b.op("Add", [y, corr], "add_mins", outputs=list(node.output))


class _InitializerView:
    """Lazy name -> numpy view of a graph's initializers (external data must be loaded)."""

    def __init__(self, graph: onnx.GraphProto):
        self._protos = {t.name: t for t in graph.initializer}
        self._cache: dict[str, np.ndarray] = {}

    def get(self, name: str):
        if name not in self._protos:
            return None
        if name not in self._cache:
            self._cache[name] = numpy_helper.to_array(self._protos[name])
        return self._cache[name]

    def __getitem__(self, name: str) -> np.ndarray:
        v = self.get(name)
        if v is None:
            raise OpError(f"initializer {name!r} not found: load the model with its external data before lowering")
        return v


def lower_for_ort(model: onnx.ModelProto, accuracy_level: int = 0, decode: bool = False,
                  float_zero_points: str = "exact") -> onnx.ModelProto:
    """Rewrite every ``trtpipe`` node into ONNX Runtime CPU ops (returns a new ModelProto).

    ``accuracy_level`` is passed to MatMulNBits (0 = fp32 activations, 4 = int8 activations).
    ``float_zero_points``: how 4-bit blocks with float zero points (GGUF Q4_1) are lowered:
    ``"exact"`` (MatMulNBits + blocksum correction) or ``"int8"`` (8-bit integer-zero-point
    blocks, each weight within ``d/32``); see :func:`_lower_int4_gemm`.
    ``decode``: the graph is a decode graph (one query per sequence, ``query_start_loc`` =
    0..S): attention is lowered without the padded-query re-packing prefill needs.
    Raises :class:`OpError` for an unknown ``trtpipe`` op or an unknown ``float_zero_points``.
    """
    if float_zero_points not in ("exact", "int8"):
        raise OpError(f"float_zero_points={float_zero_points!r}: expected 'exact' or 'int8'")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    new_nodes: list[onnx.NodeProto] = []
    shared: dict[tuple, dict[str, str]] = {}
    masks: dict[tuple, dict] = {}
    extra_inits: list[onnx.TensorProto] = []
    inits = _InitializerView(g)
    blocksums: dict = {}
    for node in g.node:
        if node.domain != OP_DOMAIN:
            new_nodes.append(node)
            continue
        b = _Builder(node.name or node.op_type)
        if node.op_type == "PagedAttention":
            key = (tuple(node.input[5:9]), _attrs(node)["block_size"])
            if key not in shared:
                ib = _Builder("/model/paged_attention_index")
                if decode:
                    shared[key] = _decode_index_subgraph(ib, *node.input[5:8], block_size=key[1])
                else:
                    shared[key] = _index_subgraph(ib, *node.input[5:9], block_size=key[1])
                new_nodes.extend(ib.nodes)
                extra_inits.extend(ib.inits)
                masks[key] = {}
            lower = _lower_paged_attention_decode if decode else _lower_paged_attention
            lower(b, node, shared[key], masks[key])
            new_nodes.extend(b.nodes)
            extra_inits.extend(b.inits)
            # masks built inside this node's builder are reused by later layers: they are
            # defined before those layers in topological order, so sharing is safe.
        elif node.op_type == "Int4Gemm":
            _lower_int4_gemm(b, node, accuracy_level, inits, blocksums, float_zero_points)
            new_nodes.extend(b.nodes)
            extra_inits.extend(b.inits)
        else:
            raise OpError(f"no ONNX Runtime lowering for {OP_DOMAIN}::{node.op_type} (node {node.name})")
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(extra_inits)
    # drop initializers no node reads any more (replaced codes/scales, unused zero points), so
    # they are not written to weights.data
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep_i = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_i)
    domains = {o.domain for o in out.opset_import}
    if MS_DOMAIN not in domains:
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    keep = [o for o in out.opset_import if o.domain != OP_DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    # drop the custom-op functions onnxscript may have attached
    keep_f = [f for f in out.functions if f.domain != OP_DOMAIN]
    del out.functions[:]
    out.functions.extend(keep_f)
    return out
