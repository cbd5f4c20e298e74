"""Write a synthetic Llama GGUF file tensor by tensor (peak memory: one tensor, not the file).

gguf-py's ``GGUFWriter`` in its streaming order: every tensor's info first (``add_tensor_info``:
name, shape, type, byte count), then header, metadata and tensor infos, then each tensor's data
(``write_tensor_data``), made just before it is written (tensors.py). The file is written beside
its final name and renamed into place, so an interrupted run never leaves a partial file there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtpipe.pipeline.model.synthetic.shape import SyntheticShape, TensorSpec
from trtpipe.pipeline.model.synthetic.tensors import tensor_data
from trtpipe.pipeline.model.synthetic.vocab import Vocabulary, smollm2_vocabulary

# llama.cpp's LLAMA_FTYPE_MOSTLY_* for the linears' type (general.file_type)
FILE_TYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8}


@dataclass(frozen=True)
class SyntheticFile:
    """What :func:`write_synthetic_gguf` wrote."""

    path: Path
    num_bytes: int
    num_parameters: int
    seconds: float


def default_file_name(shape: SyntheticShape, seed: int) -> str:
    """A name that says the shape and seed, e.g. ``synthetic-llama-32L-4096h-11008f-32000v-q4_0-s0.gguf``."""
    s = shape
    kinds = "-".join(dict.fromkeys(t.lower() for t in (s.linear_type, s.embed_type, s.head_type)))
    heads = "" if s.num_kv_heads == s.num_heads else f"-{s.num_heads}q{s.num_kv_heads}kv"
    return f"synthetic-llama-{s.num_layers}L-{s.hidden_size}h{heads}-{s.intermediate_size}f-{s.vocab_size}v-{kinds}-s{seed}.gguf"


def _metadata(w, shape: SyntheticShape, vocab: Vocabulary, seed: int) -> None:
    """llama.cpp's ``llama.*`` and ``tokenizer.ggml.*`` keys (gguf-py constants.py)."""
    w.add_name(f"synthetic-llama-{shape.num_layers}L-{shape.hidden_size}h")
    w.add_description(f"random weights (seed {seed}) in Llama shapes; tokenizer: {vocab.source}. Not a trained model.")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden_size)
    w.add_block_count(shape.num_layers)
    w.add_feed_forward_length(shape.intermediate_size)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    w.add_layer_norm_rms_eps(shape.rms_norm_eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_vocab_size(shape.vocab_size)
    w.add_file_type(FILE_TYPES[shape.linear_type])
    w.add_quantization_version(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(list(vocab.tokens))
    w.add_token_types(list(vocab.token_types))
    w.add_token_merges(list(vocab.merges))
    w.add_bos_token_id(vocab.bos_token_id)
    w.add_eos_token_id(vocab.eos_token_id)
    w.add_unk_token_id(vocab.unknown_token_id)
    w.add_pad_token_id(vocab.padding_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(vocab.chat_template)


def _nbytes(spec: TensorSpec) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[spec.qtype]]
    return spec.rows * spec.cols // block * size


def _add_info(w, spec: TensorSpec) -> None:
    from gguf import GGMLQuantizationType

    if spec.qtype in ("F32", "F16"):
        dtype, shape = np.dtype(np.float32 if spec.qtype == "F32" else np.float16), (spec.rows, spec.cols)
        w.add_tensor_info(spec.name, shape if spec.rows > 1 else (spec.cols,), dtype, _nbytes(spec))
    else:  # byte shape; gguf-py converts it back to the element shape (quant_shape_from_byte_shape)
        nbytes = _nbytes(spec)
        w.add_tensor_info(spec.name, (spec.rows, nbytes // spec.rows), np.dtype(np.uint8), nbytes,
                          raw_dtype=GGMLQuantizationType[spec.qtype])  # fmt: skip


def write_synthetic_gguf(
    path: str | Path,
    shape: SyntheticShape,
    seed: int = 0,
    *,
    vocab: Vocabulary | None = None,
    log: Callable[[str], None] | None = None,
) -> SyntheticFile:
    """Write ``shape`` with random weights from ``seed`` to ``path`` (see the module docstring).
    ``vocab``: the tokenizer (default :func:`smollm2_vocabulary` of ``shape.vocab_size``).
    The same arguments give the same bytes. Raises :class:`SyntheticShapeError` for a shape or
    type that cannot be written."""
    from gguf import GGUFWriter

    t0 = time.perf_counter()
    shape.check()
    vocab = vocab or smollm2_vocabulary(shape.vocab_size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    specs = shape.tensors()
    w = GGUFWriter(tmp, "llama")
    try:
        _metadata(w, shape, vocab, seed)
        for spec in specs:
            _add_info(w, spec)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for spec in specs:
            w.write_tensor_data(tensor_data(spec, seed))
            if log is not None and spec.name.endswith("ffn_down.weight"):
                log(
                    f"  layer {spec.name.split('.')[1]} of {shape.num_layers} written ({time.perf_counter() - t0:.0f} s)"
                )
        w.close()
        os.replace(tmp, path)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    return SyntheticFile(path, path.stat().st_size, shape.num_parameters(), time.perf_counter() - t0)
