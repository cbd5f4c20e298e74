"""Achieved decode bandwidth: the bytes one decode step reads divided by its time (TPOT).

A decode step is memory-bound (gpt-fast reports this figure next to tokens/s): it reads every
weight it multiplies by once, and each sequence's KV cache once. One home for that byte count,
used by the runtime (``trtpipe generate``, the validate report) from an artifact's manifest and by
``trtpipe estimate`` from model facts alone::

    weights read per step = the decode weights, minus the embedding table when it is only
                            gathered (a separate LM head exists); a tied table that is also the
                            LM head is read whole
    KV read per step      = batch x sum_l 2 x kv_heads_l x row_bytes x min(context, W_l)
                            (W_l: layer l's sliding window, 0 = full attention; row_bytes: one
                            token of one kv head, head_dim x dtype bytes + an int8 pool's scale,
                            plugins/core/kv_codec.py)
    achieved bandwidth    = (weights read + KV read) / TPOT                    [bytes/s]

Activations, logits and the KV written by the step are left out (a few hundred kB per step for
the shipped models, under 1 % of the weights). Torch-free: the runtime imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtpipe.plugins.core.dtypes import activation_dtype, dtype
from trtpipe.plugins.core.kv_codec import kv_head_token_bytes
from trtpipe.runtime.artifact.model_config import ModelConfig


def kv_bytes_per_layer(
    layer_num_kv_heads: Sequence[int],
    layer_sliding_window: Sequence[int],
    head_dim: int,
    num_tokens: int,
    kv_dtype: str,
) -> tuple[int, ...]:
    """K and V bytes of each layer for one sequence of ``num_tokens`` tokens:
    ``2 x kv_heads_l x row_bytes x min(num_tokens, W_l)`` (``W_l`` = 0: no window; ``row_bytes``
    = :func:`~trtpipe.plugins.core.kv_codec.kv_head_token_bytes` of ``kv_dtype``, ``fp16`` or
    ``float16`` spelling, int8 scales included)."""
    row = kv_head_token_bytes(kv_dtype, head_dim)
    out = []
    for kvh, w in zip(layer_num_kv_heads, layer_sliding_window):
        tokens = min(num_tokens, w) if w > 0 else num_tokens
        out.append(2 * kvh * row * tokens)
    return tuple(out)


_LEGACY_KV_BYTES = {4: "float32", 2: "float16"}  # reports written before "kv_dtype" (float pools only)


def weight_read_bytes(weight_bytes: int, embedding_bytes: int, embedding_is_lm_head: bool) -> int:
    """Weight bytes one forward step reads: all of ``weight_bytes`` but the embedding table, of
    which a step gathers only a few rows, unless the table is also the (tied) LM head."""
    return weight_bytes if embedding_is_lm_head else weight_bytes - embedding_bytes


@dataclass(frozen=True)
class DecodeReadModel:
    """What one decode step reads, as a function of its batch and context (bytes)."""

    weight_read_bytes: int  # per step, whatever the batch
    kv_dtype: str  # the pool's: "float32", "float16", "bfloat16", "int8" (or fp32, ... spelling)
    head_dim: int
    layer_num_kv_heads: tuple[int, ...]  # [num_layers]
    layer_sliding_window: tuple[int, ...]  # [num_layers], 0 = full attention
    source: str  # how weight_read_bytes was found (shown in reports)

    def kv_read_bytes(self, context_tokens: int, batch: int = 1) -> int:
        """KV bytes a step reads: ``batch`` sequences of ``context_tokens`` tokens each."""
        per_seq = kv_bytes_per_layer(
            self.layer_num_kv_heads, self.layer_sliding_window, self.head_dim, context_tokens, self.kv_dtype
        )
        return batch * sum(per_seq)

    def step_read_bytes(self, context_tokens: int, batch: int = 1) -> int:
        """Bytes one decode step of ``batch`` sequences at ``context_tokens`` reads."""
        return self.weight_read_bytes + self.kv_read_bytes(context_tokens, batch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_read_bytes": self.weight_read_bytes,
            "kv_dtype": self.kv_dtype,
            "head_dim": self.head_dim,
            "layer_num_kv_heads": list(self.layer_num_kv_heads),
            "layer_sliding_window": list(self.layer_sliding_window),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodeReadModel:
        return cls(
            int(d["weight_read_bytes"]),
            str(d["kv_dtype"]) if "kv_dtype" in d else _LEGACY_KV_BYTES[int(d["kv_dtype_bytes"])],
            int(d["head_dim"]),
            tuple(d["layer_num_kv_heads"]),
            tuple(d["layer_sliding_window"]),
            str(d.get("source", "")),
        )


def _embedding_from_initializers(
    config: ModelConfig, initializers: Mapping[str, Sequence[Any]]
) -> tuple[int, bool] | None:
    """(embedding table bytes, is it also the LM head) from the artifact's initializer table
    (``name -> [dtype, shape, offset, nbytes]``); None when no ``[vocab, hidden]`` table is found.
    The table is the LM head unless another initializer has a vocab-sized dimension (a separate
    head: untied weights, or the 8-bit head of a tied Q8_0 embedding in int4 cpu artifacts)."""
    emb = None
    others_with_vocab = False
    for name, (_dt, shape, _off, nbytes) in initializers.items():
        if emb is None and list(shape) == [config.vocab_size, config.hidden_size] and "embed" in name:
            emb = int(nbytes)
        elif config.vocab_size in shape:
            others_with_vocab = True
    return None if emb is None else (emb, not others_with_vocab)


def decode_read_model(
    config: ModelConfig,
    kv_dtype: str,
    weight_bytes: int,
    activation_dtype: str,
    initializers: Mapping[str, Sequence[Any]] | None = None,
) -> DecodeReadModel:
    """The read model of an artifact whose weights take ``weight_bytes`` bytes.

    ``kv_dtype``/``activation_dtype``: ``float32``/``fp32`` etc. (the embedding's dtype when the
    initializer table does not give it). ``initializers``: the cpu artifact's shared-initializer
    table; without it (TensorRT plans) the embedding is the LM head exactly when the model ties
    them (``tie_word_embeddings``). Raises ValueError for an unknown dtype.
    """
    found = _embedding_from_initializers(config, initializers) if initializers else None
    if found is not None:
        emb, tied = found
        how = "artifact weights minus the gathered embedding table" if not tied else "artifact weights (tied head)"
    else:
        emb = config.vocab_size * config.hidden_size * dtype(activation_dtype).itemsize
        tied = config.tie_word_embeddings
        how = "artifact weights" + ("" if tied else " minus the embedding table (model facts)")
    return DecodeReadModel(
        weight_read_bytes(weight_bytes, emb, tied),
        kv_dtype,
        config.head_dim,
        tuple(config.layer_num_kv_heads),
        tuple(config.layer_sliding_window),
        how,
    )


def read_model_from_manifest(manifest: Any, engine: str | None = None) -> DecodeReadModel | None:
    """The read model of a loaded :class:`~trtpipe.runtime.artifact.manifest.Manifest` for the
    engine that runs it (``engine.capabilities.backend``; None: the one the artifact runs by default). None when
    the manifest does not record its weight bytes (``build_info.weights_bytes``, artifacts built
    before it was written)."""
    weight_bytes = manifest.build_info.get("weights_bytes")
    if not weight_bytes:
        return None
    precision = manifest.graphs["decode"].precision
    read_bytes = manifest.build_info.get("decode_weight_read_bytes")
    if engine == "ort":  # an artifact with a native engine records ONNX Runtime's figure beside it
        read_bytes = manifest.build_info.get("decode_weight_read_bytes_ort", read_bytes)
    if read_bytes:  # counted on the graph that runs decode steps at build time (cpu artifacts)
        c = manifest.model
        return DecodeReadModel(
            int(read_bytes),
            manifest.kv.dtype,
            c.head_dim,
            tuple(c.layer_num_kv_heads),
            tuple(c.layer_sliding_window),
            "the decode step's weights: native.bin, or the decode graph's minus gathered-only tables "
            "(build_info.decode_weight_read_bytes)",
        )
    act = activation_dtype(precision, "cpu" if manifest.target.get("name") == "cpu" else "gpu")
    return decode_read_model(
        manifest.model, manifest.kv.dtype, int(weight_bytes), act, manifest.runtime_options.get("shared_initializers")
    )


@dataclass(frozen=True)
class DecodeBandwidth:
    """Achieved decode bandwidth of a run: ``step_read_bytes / tpot_s``."""

    step_read_bytes: int
    tpot_s: float
    peak_bytes_per_s: float | None = None  # the target's read bandwidth, where known

    @property
    def bytes_per_s(self) -> float:
        return self.step_read_bytes / self.tpot_s

    @property
    def fraction_of_peak(self) -> float | None:
        return None if not self.peak_bytes_per_s else self.bytes_per_s / self.peak_bytes_per_s

    def describe(self) -> str:
        """``"decode bandwidth 12.4 GB/s (107.3 MB per step / 8.65 ms TPOT; 41% of 30.0 GB/s)"``."""
        frac, peak_bw = self.fraction_of_peak, self.peak_bytes_per_s
        peak = "" if frac is None or peak_bw is None else f"; {frac:.0%} of {peak_bw / 1e9:.1f} GB/s"
        return (
            f"decode bandwidth {self.bytes_per_s / 1e9:.1f} GB/s ({self.step_read_bytes / 1e6:.1f} MB per step / "
            f"{self.tpot_s * 1e3:.3g} ms TPOT{peak})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_read_bytes": self.step_read_bytes,
            "tpot_s": self.tpot_s,
            "bytes_per_s": self.bytes_per_s,
            "peak_bytes_per_s": self.peak_bytes_per_s,
            "fraction_of_peak": self.fraction_of_peak,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodeBandwidth:
        """Inverse of :meth:`to_dict` (the derived fields are recomputed)."""
        return cls(int(d["step_read_bytes"]), float(d["tpot_s"]), d.get("peak_bytes_per_s"))


def decode_bandwidth(
    model: DecodeReadModel,
    tpot_s: float | None,
    context_tokens: int,
    batch: float = 1,
    peak_bytes_per_s: float | None = None,
) -> DecodeBandwidth | None:
    """Bandwidth of decode steps of ``batch`` sequences (a mean may be fractional) at
    ``context_tokens``, each taking ``tpot_s``; None without a TPOT (a one-token output)."""
    if tpot_s is None or tpot_s <= 0:
        return None
    batch_kv = round(batch * model.kv_read_bytes(context_tokens))
    return DecodeBandwidth(model.weight_read_bytes + batch_kv, tpot_s, peak_bytes_per_s)


def scenario_decode_bandwidth(
    model: DecodeReadModel, summary: Mapping[str, Any], peak_bytes_per_s: float | None = None
) -> DecodeBandwidth | None:
    """The bandwidth of a validate scenario from its report summary (``MetricsSummary.to_dict``):
    TPOT p50, the mean decode batch, and the mean context of a decode step (mean prompt plus half
    the mean output). None when the scenario has no TPOT."""
    tpot = summary.get("tpot_ms") or {}
    n = summary.get("num_requests") or 0
    if not tpot.get("p50") or not n:
        return None
    context = round((summary["total_prompt_tokens"] + summary["total_output_tokens"] / 2) / n)
    return decode_bandwidth(
        model, tpot["p50"] / 1e3, context, summary.get("mean_decode_batch_size") or 1, peak_bytes_per_s
    )


def request_decode_note(
    manifest: Any,
    prompt_tokens: int,
    output_tokens: int,
    tpot_s: float | None,
    peak_bytes_per_s: float | None = None,
    engine: str | None = None,
) -> str:
    """``trtpipe generate``'s figure for one request: ``"; decode 116 tokens/s, decode bandwidth
    ..."`` at the request's mean decode context (prompt plus half the output, batch 1); "" when
    it has no TPOT or the manifest lacks its weight bytes."""
    model = read_model_from_manifest(manifest, engine)
    bw = (
        None
        if model is None
        else decode_bandwidth(model, tpot_s, prompt_tokens + output_tokens // 2, 1, peak_bytes_per_s)
    )
    if bw is None:
        return ""
    return f"; decode {1 / bw.tpot_s:.1f} tokens/s, {bw.describe()}"
