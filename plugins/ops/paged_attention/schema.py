"""ONNX shape inference of ``trtpipe::PagedAttention`` (docs/contracts.md): ``output`` has
query's type and shape; ``key_cache_out`` / ``value_cache_out`` have the key_cache /
value_cache type and shape (and ``key_scale_out`` / ``value_scale_out`` the scales' when an int8
pool has them). Statically known dims that contradict the attributes (query's last
dim != num_heads * head_size, a cache not ``[num_kv_heads, NB, block_size, head_size]``) raise
``onnx.shape_inference.InferenceError``. onnx is imported lazily (inside the helpers).
"""

from __future__ import annotations

from typing import Any

from trtpipe.plugins.ops.onnx_schema import attr_int, check_dims, copy_type, dims

__all__ = ["infer_paged_attention"]

PAGED_SCALES = ("key_scale", "value_scale")


def infer_paged_attention(ctx: Any) -> None:
    H = attr_int(ctx, "num_heads")
    KVH = attr_int(ctx, "num_kv_heads")
    D = attr_int(ctx, "head_size")
    BS = attr_int(ctx, "block_size")
    q = dims(ctx.get_input_type(0))
    T = q[0] if q and len(q) == 2 else None
    hd = H * D if H and D else None
    kvd = KVH * D if KVH and D else None
    check_dims("PagedAttention", "query", q, [None, hd])
    check_dims("PagedAttention", "key", dims(ctx.get_input_type(1)), [T, kvd])
    check_dims("PagedAttention", "value", dims(ctx.get_input_type(2)), [T, kvd])
    kc = dims(ctx.get_input_type(3))
    check_dims("PagedAttention", "key_cache", kc, [KVH, None, BS, D])
    check_dims("PagedAttention", "value_cache", dims(ctx.get_input_type(4)), kc or [KVH, None, BS, D])
    check_dims("PagedAttention", "slot_mapping", dims(ctx.get_input_type(5)), [T])
    copy_type(ctx, 0, 0)
    copy_type(ctx, 3, 1)
    copy_type(ctx, 4, 2)
    if ctx.get_num_inputs() > 10 and ctx.get_num_outputs() > 4:  # an int8 pool's scales [KVH, NB, BS]
        for i in (9, 10):
            check_dims("PagedAttention", PAGED_SCALES[i - 9], dims(ctx.get_input_type(i)), (kc or [KVH, None, BS])[:3])
            copy_type(ctx, i, i - 6)
