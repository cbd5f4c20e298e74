"""A synthetic tensor's values: deterministic from (seed, tensor index), made a row chunk at a time.

Every tensor draws from its own NumPy ``PCG64`` stream (``SeedSequence([seed, index])``), so a
tensor's bytes do not depend on the others or on the order they are made in. Linears, the
embedding and the head are N(0, 0.02) (Llama's initializer range) quantized by gguf-py
(``gguf.quants.quantize``, llama.cpp's reference rounding) ``ROW_CHUNK_ELEMENTS`` at a time, so at
most one chunk of fp32 values (32 MiB) and one tensor's blocks are held. Norms are 1 + N(0, 0.05)
in F32. Q6_K, which gguf-py cannot quantize, is random blocks (ggml-common.h ``block_q6_K``:
ql[128], qh[64], int8 scales[16], fp16 d) whose values have a std of about 0.02.
"""

from __future__ import annotations

import numpy as np

from trtpipe.pipeline.model.synthetic.shape import TensorSpec

WEIGHT_STD = 0.02  # HF LlamaConfig.initializer_range
NORM_STD = 0.05
ROW_CHUNK_ELEMENTS = 8 * 2**20  # fp32 values made per chunk: 32 MiB
Q6_K_BLOCK_BYTES = 210  # 128 ql + 64 qh + 16 scales + 2 d, per 256 weights


def tensor_rng(seed: int, spec: TensorSpec) -> np.random.Generator:
    """The tensor's own random stream."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, spec.index])))


def row_chunks(spec: TensorSpec) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` row ranges of at most ``ROW_CHUNK_ELEMENTS`` values each."""
    step = max(1, ROW_CHUNK_ELEMENTS // spec.cols)
    return [(r, min(r + step, spec.rows)) for r in range(0, spec.rows, step)]


def float_chunks(spec: TensorSpec, seed: int):
    """Yields ``(start, stop, values)``: the tensor's fp32 values ``[stop - start, cols]`` before
    quantization, chunk by chunk (not for Q6_K tensors, which are drawn as blocks)."""
    rng = tensor_rng(seed, spec)
    for start, stop in row_chunks(spec):
        x = rng.standard_normal((stop - start, spec.cols), dtype=np.float32)
        if spec.kind == "norm":
            x = x * np.float32(NORM_STD) + np.float32(1.0)
        else:
            x *= np.float32(WEIGHT_STD)
        yield start, stop, x


def _q6_k_blocks(rng: np.random.Generator, num_blocks: int) -> np.ndarray:
    """Random Q6_K blocks ``uint8 [num_blocks, 210]``: ql, qh uniform bytes (codes 0..63, value
    q - 32), scales uniform int8 in [-127, 127], d = 0.02 / (std(q - 32) * std(scale)) in fp16."""
    blocks = np.empty((num_blocks, Q6_K_BLOCK_BYTES), dtype=np.uint8)
    blocks[:, :192] = rng.integers(0, 256, (num_blocks, 192), dtype=np.uint8)
    blocks[:, 192:208] = rng.integers(-127, 128, (num_blocks, 16), dtype=np.int8).view(np.uint8)
    d = np.float16(WEIGHT_STD / (18.5 * 73.3))  # std of uniform -32..31 and of uniform -127..127
    blocks[:, 208:210] = np.full((num_blocks, 1), d, dtype=np.float16).view(np.uint8)
    return blocks


def tensor_data(spec: TensorSpec, seed: int) -> np.ndarray:
    """The tensor as stored: ``float32 [cols]`` for a norm, ``float16 [rows, cols]`` for F16,
    else the GGUF blocks ``uint8 [rows, row_bytes]`` (gguf-py ``quant_shape_to_byte_shape``)."""
    from gguf import GGMLQuantizationType, quant_shape_to_byte_shape
    from gguf.quants import quantize

    if spec.kind == "norm":
        return next(float_chunks(spec, seed))[2].reshape(spec.cols)
    qtype = GGMLQuantizationType[spec.qtype]
    if spec.qtype == "Q6_K":
        blocks = _q6_k_blocks(tensor_rng(seed, spec), spec.rows * spec.cols // 256)
        return blocks.reshape(spec.rows, -1)
    if spec.qtype == "F16":
        out = np.empty((spec.rows, spec.cols), dtype=np.float16)
    else:
        out = np.empty(quant_shape_to_byte_shape((spec.rows, spec.cols), qtype), dtype=np.uint8)
    for start, stop, x in float_chunks(spec, seed):
        out[start:stop] = quantize(x, qtype)
    return out
