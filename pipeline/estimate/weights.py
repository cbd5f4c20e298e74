"""Weight bytes of each phase's graph/plan, and of both phases resident together (the layout).

Linear layers are stored at the phase precision (INT4: 0.5 B per weight plus the per-group scale
and zero point of the target's format; on cpu, GGUF Q4_1 blocks in the form
``engine.ort_float_zero_points`` picks, and the 8-bit LM head of a tied Q8_0 embedding);
embedding, lm_head and norms at the phase's activation dtype. ``docs/estimate.md`` has the sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.pipeline.estimate.model_counts import bias_params, linear_params, norm_params
from trtpipe.plugins.core.dtypes import activation_dtype, dtype
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.metrics.decode_bandwidth import weight_read_bytes

INT4_BITS_BYTES = 0.5  # two 4-bit codes per byte
# Per-group overhead of INT4 weights (one group = group_size weights along K of one row): cpu
# artifacts of GGUF Q4_1 weights (float zero points) take one of the two forms of
# plugins/ops/int4_gemm/lower_ort.py (engine.ort_float_zero_points); GPU plugins keep an fp16 scale and, when
# asymmetric, a packed 4-bit zero point.
INT4_GROUP_BYTES_CPU = {  # per group of a cpu artifact, by engine.ort_float_zero_points
    "exact": 8.0,  # 4-bit codes; fp32 scale, fp32 block offset (correction term); no zero-point input
    "int8": 5.0,  # 8-bit codes (Q4_1 re-coded, 1 B per weight); fp32 scale, uint8 zero point
}
CPU_CODE_BYTES = {"exact": INT4_BITS_BYTES, "int8": 1.0}
# A tied GGUF embedding (Q8_0) also becomes an 8-bit MatMulNBits LM head in int4 phases (the
# fp32 table stays for the embedding Gather): 1 B per weight + fp32 scale per block of 32 (Q8_0's
# zero point is MatMulNBits' implicit 128: no zero-point input).
CPU_INT8_HEAD_BYTES_PER_WEIGHT = 1.0 + 4.0 / 32
INT4_GROUP_BYTES_GPU_SCALE = 2.0
INT4_GROUP_BYTES_GPU_ZERO_POINT = 0.5


@dataclass(frozen=True)
class PhaseWeights:
    """Weight bytes of one phase's graph/plan."""

    precision: str  # fp32 | fp16 | bf16 | int4
    activation_dtype: str  # dtype of embedding, lm_head, norms and activations
    linear_bytes: int  # GEMM weights (INT4: packed codes)
    int4_group_bytes: int  # INT4 scales + zero points (0 unless int4)
    embedding_bytes: int
    lm_head_bytes: int  # 0 when tied to the embedding (one tensor); cpu int4: the 8-bit head
    other_bytes: int  # norms and biases

    @property
    def total_bytes(self) -> int:
        return self.linear_bytes + self.int4_group_bytes + self.embedding_bytes + self.lm_head_bytes + self.other_bytes

    @property
    def step_read_bytes(self) -> int:
        """Bytes one forward step reads: everything but the embedding table, of which it only
        gathers a few rows, unless the table is also the (tied) lm_head
        (:func:`trtpipe.runtime.metrics.decode_bandwidth.weight_read_bytes`)."""
        return weight_read_bytes(self.total_bytes, self.embedding_bytes, embedding_is_lm_head=self.lm_head_bytes == 0)


def _int4_cpu_bytes(config: ModelConfig, group_size: int, form: str) -> tuple[int, int, int | None]:
    """(codes, group bytes, 8-bit head or None) of a cpu INT4 phase in ``form`` (exact | int8)."""
    if form not in INT4_GROUP_BYTES_CPU:
        raise ValueError(f"cpu_float_zero_points {form!r}: expected exact or int8")
    n_lin = linear_params(config)
    head = (
        int(config.vocab_size * config.hidden_size * CPU_INT8_HEAD_BYTES_PER_WEIGHT)
        if config.tie_word_embeddings
        else None
    )
    return int(n_lin * CPU_CODE_BYTES[form]), int(n_lin // group_size * INT4_GROUP_BYTES_CPU[form]), head


def phase_weights(
    config: ModelConfig,
    precision: str,
    family: str,
    *,
    group_size: int = 32,
    symmetric: bool = False,
    cpu_float_zero_points: str = "exact",
) -> PhaseWeights:
    """Weight bytes of a phase at ``precision`` on a target family (``cpu`` or a GPU).

    cpu INT4 assumes the shipped source, a GGUF with Q4_1 GEMM weights and a tied Q8_0
    embedding: ``cpu_float_zero_points`` (``exact`` | ``int8``, the recipe's resolved
    ``engine.ort_float_zero_points``) picks the block form (:data:`INT4_GROUP_BYTES_CPU`), and
    the tied embedding adds an 8-bit LM head. Raises ValueError for an unknown form.
    """
    act = activation_dtype(precision, family)
    act_b = dtype(act).itemsize
    n_lin = linear_params(config)
    emb = config.vocab_size * config.hidden_size * act_b
    lm_head = 0 if config.tie_word_embeddings else emb
    if precision == "int4" and family == "cpu":
        linear, group_bytes, head = _int4_cpu_bytes(config, group_size, cpu_float_zero_points)
        lm_head = lm_head if head is None else head
    elif precision == "int4":
        linear = int(n_lin * INT4_BITS_BYTES)
        per_group = INT4_GROUP_BYTES_GPU_SCALE + (0 if symmetric else INT4_GROUP_BYTES_GPU_ZERO_POINT)
        group_bytes = int(n_lin // group_size * per_group)
    else:
        linear, group_bytes = n_lin * dtype(precision).itemsize, 0
    return PhaseWeights(
        precision, act, linear, group_bytes, emb, lm_head, (norm_params(config) + bias_params(config)) * act_b
    )


def engine_weight_bytes(prefill: PhaseWeights, decode: PhaseWeights, layout: str) -> int | None:
    """Weights resident for both phases.

    ``split`` (two TensorRT plans): each plan holds its own copy. ``dual_profile``: one copy;
    None when the phases differ in precision (that layout needs one). ``shared`` (cpu: one
    weights.data, identical initializers stored once): the decode GEMMs are added to the prefill
    weights; embedding, lm_head and norms are shared when both phases have the same dtype.
    Raises ValueError for another layout.
    """
    same = prefill.precision == decode.precision
    if layout == "split":
        return prefill.total_bytes + decode.total_bytes
    if layout == "dual_profile":
        return prefill.total_bytes if same else None
    if layout == "shared":
        if same:
            return prefill.total_bytes
        extra = decode.linear_bytes + decode.int4_group_bytes
        if decode.activation_dtype != prefill.activation_dtype:
            extra += decode.embedding_bytes + decode.lm_head_bytes + decode.other_bytes
        elif decode.lm_head_bytes != prefill.lm_head_bytes:  # e.g. the cpu int4 8-bit head
            extra += decode.lm_head_bytes
        return prefill.total_bytes + extra
    raise ValueError(f"layout {layout!r}")
