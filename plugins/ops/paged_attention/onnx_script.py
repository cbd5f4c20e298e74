"""onnxscript functions that emit one ``trtpipe`` node per custom op (used by the torch exporter's
``custom_translation_table``). No ``from __future__ import annotations`` here: onnxscript reads
the type annotations as objects."""

import onnxscript
from onnxscript import FLOAT, INT64, UINT8

from trtpipe.plugins import OP_DOMAIN, OP_VERSION

op = onnxscript.values.Opset(OP_DOMAIN, OP_VERSION)


@onnxscript.script(opset=op)
def paged_attention_onnx(
    query: FLOAT,
    key: FLOAT,
    value: FLOAT,
    key_cache: FLOAT,
    value_cache: FLOAT,
    slot_mapping: INT64,
    block_tables: INT64,
    context_lens: INT64,
    query_start_loc: INT64,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float,
    block_size: int,
    sliding_window: int,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    o, kc, vc = op.PagedAttention(
        query,
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        block_tables,
        context_lens,
        query_start_loc,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        scale=scale,
        block_size=block_size,
        sliding_window=sliding_window,
    )
    return o, kc, vc


@onnxscript.script(opset=op)
def int4_gemm_onnx(
    a: FLOAT, b_packed: UINT8, scales: FLOAT, zero_points: FLOAT, K: int, N: int, group_size: int, bits: int = 4
) -> FLOAT:
    return op.Int4Gemm(a, b_packed, scales, zero_points, K=K, N=N, group_size=group_size, bits=bits)
