"""THE description of ``trtpipe::PagedAttention``: inputs, outputs, type constraints, attributes,
and the two TensorRT plugins it lowers to (a Python AOT plugin launches one kernel, so the
write and the attention are two plugins: :mod:`trtpipe.plugins.ops.paged_attention.lower_trt`).
Every backend's parameter list is built from :data:`PAGED_ATTENTION` (:mod:`trtpipe.plugins.ops.spec`).
"""

from __future__ import annotations

from trtpipe.plugins.ops.spec import FLOAT_TENSORS, TRT_PARSER_FIELDS, Attribute, OpSpec, PluginSpec, Tensor
from trtpipe.plugins.ops.spec import TypeConstraint as C

KV_TENSORS = (*FLOAT_TENSORS, "tensor(bfloat16)", "tensor(int8)")  # what a pool may hold

__all__ = ["PAGED_ATTENTION"]

_ATTRIBUTES = (
    Attribute("num_heads", "int", None, "H"),
    Attribute("num_kv_heads", "int", None, "KVH; num_heads % num_kv_heads == 0"),
    Attribute("head_size", "int", None, "D"),
    Attribute("scale", "float", 0.0, "softmax scale; 0 means 1/sqrt(head_size)"),
    Attribute("block_size", "int", None, "BS, tokens per KV block"),
    Attribute("sliding_window", "int", 0, "W; 0 = off; query at p sees keys p-W < j <= p"),
)
_BY_NAME = {a.name: a for a in _ATTRIBUTES}
_DECODE = Attribute("decode", "int", None, "1: one query token per sequence (decode kernel); 0: ragged prefill")

PAGED_ATTENTION = OpSpec(
    name="PagedAttention",
    torch_name="paged_attention",
    doc=(
        "Writes this step's K/V into the paged KV pool at slot_mapping, then causal GQA "
        "attention of the packed ragged queries over the pool through block tables, with an "
        "optional Hugging Face sliding window. Reference: trtpipe.plugins.ops.paged_attention.reference.paged_attention."
    ),
    inputs=(
        Tensor("query", "T", "[T, H*D], RoPE applied"),
        Tensor("key", "T", "[T, KVH*D] new tokens' K, RoPE applied"),
        Tensor("value", "T", "[T, KVH*D] new tokens' V"),
        Tensor("key_cache", "T_CACHE", "[KVH, NB, BS, D] head-major"),
        Tensor("value_cache", "T_CACHE", "[KVH, NB, BS, D]"),
        Tensor("slot_mapping", "T_INDEX", "[T] where token t is written: block_id*BS + pos % BS", rank=1),
        Tensor("block_tables", "T_INDEX", "[S, MB] logical -> physical block; padding 0", rank=2),
        Tensor("context_lens", "T_INDEX", "[S] tokens in the pool after this step", rank=1),
        Tensor("query_start_loc", "T_INDEX", "[S+1] packed offsets of each sequence", rank=1),
        Tensor("key_scale", "T_SCALE", "[KVH, NB, BS] per token-head scale of an int8 key_cache", optional=True),
        Tensor("value_scale", "T_SCALE", "[KVH, NB, BS] per token-head scale of an int8 value_cache", optional=True),
    ),
    outputs=(
        Tensor("output", "T", "[T, H*D]"),
        Tensor("key_cache_out", "T_CACHE", "key_cache with this step's K written (aliased in place)"),
        Tensor("value_cache_out", "T_CACHE", "value_cache with this step's V written (aliased in place)"),
        Tensor("key_scale_out", "T_SCALE", "key_scale with this step's scales written (int8 pool)", optional=True),
        Tensor("value_scale_out", "T_SCALE", "value_scale with this step's scales written (int8 pool)", optional=True),
    ),
    type_constraints=(
        C("T", FLOAT_TENSORS, "query/key/value/output"),
        C("T_CACHE", KV_TENSORS, "KV pool: kv_cache.dtype fp32 | fp16 | bf16 | int8 (plugins/core/kv_codec.py)"),
        C("T_SCALE", ("tensor(float)",), "int8 pool scales"),
        C("T_INDEX", ("tensor(int64)",), "indices"),
    ),
    attributes=(*_ATTRIBUTES, *TRT_PARSER_FIELDS),
    plugins=(
        PluginSpec(
            "PagedKVWrite",
            inputs=("key", "value", "key_cache", "value_cache", "slot_mapping"),
            outputs=("key_cache_out", "value_cache_out"),  # aliased to key_cache / value_cache: in place
            attributes=tuple(_BY_NAME[n] for n in ("num_kv_heads", "head_size", "block_size")),
        ),
        PluginSpec(
            "PagedAttention",
            inputs=("query", "key_cache", "value_cache", "block_tables", "context_lens", "query_start_loc"),
            outputs=("output",),
            attributes=(*_ATTRIBUTES, _DECODE),
            autotune_attributes=("decode",),
        ),
    ),
)
