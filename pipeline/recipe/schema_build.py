"""The build-side sections of a recipe: model, precision (and INT4 settings), paged KV cache,
scheduler, TensorRT optimization profiles and engine settings. Each section validates its own keys;
checks across sections live in :mod:`trtpipe.pipeline.recipe.checks`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trtpipe.pipeline.recipe.base import KVDtype, Phase, Precision, Spec, is_pow2, nearest_pow2
from trtpipe.pipeline.recipe.errors import MISSING, Issue, fail
from trtpipe.runtime.artifact.model_config import ModelConfig


class Int4Spec(Spec):
    """Weight-only INT4 quantization (blockwise along K, see ``trtpipe::Int4Gemm``).

    ``group_size``: weights per scale, a power of two >= 16 that divides every GEMM's K
    (hidden size, intermediate size, heads*head_dim). ``symmetric``: no zero points (code 8 is
    zero) when true; per-group zero points when false (more accurate, slightly slower).
    """

    group_size: int = Field(32, examples=[32])
    symmetric: bool = False

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, v: int) -> int:
        if v < 16 or not is_pow2(v):
            lo, hi = nearest_pow2(max(v, 16))
            raise fail(
                Issue(
                    (),
                    v,
                    "a power of two >= 16 (INT4 packs two codes per byte and the kernels tile groups by 16)",
                    f"use {max(lo, 16)} or {max(hi, 32)}",
                )
            )
        return v


class PrecisionSpec(Spec):
    """Precision of each phase. ``fp32``/``fp16``/``bf16``: weights and activations in that
    dtype. ``int4``: weight-only INT4 (``int4`` settings below); activations in fp32 on the cpu
    target and fp16 on GPU targets (see :meth:`Recipe.activation_dtype`)."""

    prefill: Precision = Field(examples=["fp16"])
    decode: Precision = Field(examples=["int4"])
    int4: Int4Spec = Field(default_factory=Int4Spec)


class KVCacheSpec(Spec):
    """The paged KV pool shared by prefill and decode.

    ``block_size``: tokens per block (power of two). Size the pool with ``num_blocks`` (block 0
    is the null block, so ``num_blocks - 1`` are usable) or ``memory_budget_mib`` (K and V of all
    layers), not both; with neither, the pool holds ``max_batch_size`` full sequences (see
    :func:`plan_kv_num_blocks`). ``dtype``: None means the decode activation dtype. (Prefix
    caching is a runtime setting: ``runtime.prefix_caching``.)
    """

    block_size: int = Field(16, ge=1, examples=[16])
    num_blocks: int | None = Field(None, ge=2, examples=[513])
    memory_budget_mib: float | None = Field(None, gt=0, examples=[2048])
    dtype: KVDtype | None = None

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int) -> int:
        if not is_pow2(v):
            lo, hi = nearest_pow2(v)
            raise fail(
                Issue(
                    (),
                    v,
                    "a power of two (slots are block_id * block_size + position % block_size)",
                    f"use {lo} or {hi}",
                )
            )
        return v


class Range(Spec):
    """One dimension of a TensorRT optimization profile: ``1 <= min <= opt <= max``.
    TensorRT tunes kernels for ``opt`` and accepts any size in ``[min, max]``."""

    min: int = Field(ge=1, examples=[1])
    opt: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.opt:
            raise fail(Issue(("min",), self.min, f"min <= opt ({self.opt})", f"lower min to {self.opt} or less"))
        if self.opt > self.max:
            raise fail(
                Issue(("opt",), self.opt, f"opt <= max ({self.max})", f"lower opt to {self.max} or less, or raise max")
            )
        return self


class PrefillProfile(Spec):
    """Prefill profile: ``tokens`` in the packed batch (T) and ``sequences`` in it (S)."""

    tokens: Range
    sequences: Range

    @model_validator(mode="after")
    def _seqs_fit(self) -> PrefillProfile:
        if self.sequences.max > self.tokens.max:
            raise fail(
                Issue(
                    ("sequences", "max"),
                    self.sequences.max,
                    f"at most tokens.max ({self.tokens.max}): every sequence in a "
                    "prefill batch brings at least one token",
                    f"lower sequences.max to {self.tokens.max}",
                )
            )
        return self


class DecodeProfile(Spec):
    """Decode profile: ``batch`` = running sequences (S); ``context`` = tokens per sequence
    (sets the block-table width ``ceil(context.max / block_size)``)."""

    batch: Range
    context: Range


class ProfilesSpec(Spec):
    """TensorRT optimization profiles per phase (GPU targets only). A phase left out gets
    profiles derived from the limits (see :meth:`Recipe.resolved_profiles`)."""

    prefill: PrefillProfile | None = None
    decode: DecodeProfile | None = None


class PhaseAccuracyLevels(Spec):
    """MatMulNBits ``accuracy_level`` per phase (cpu target): 0 = fp32 activations, 4 = int8."""

    prefill: Literal[0, 4]
    decode: Literal[0, 4]


class SiteActivationLevels(Spec):
    """int8 levels of one phase's GEMM activations per site in the native engine: ``attention`` (QKV
    and output projections), ``mlp`` (gate/up, down), ``head`` (LM head); all three required."""

    attention: Literal[1, 2]
    mlp: Literal[1, 2]
    head: Literal[1, 2]


class PhaseActivationLevels(Spec):
    """int8 levels of GEMM activations per phase in the native engine: 2 (~15 bits, the reference's
    answers), 1 (8 bits, faster, flips near-ties) or one per GEMM site (:class:`SiteActivationLevels`)."""

    prefill: Literal[1, 2] | SiteActivationLevels
    decode: Literal[1, 2] | SiteActivationLevels

    @field_validator("prefill", "decode", mode="before")
    @classmethod
    def _one_level_or_every_site(cls, v: object) -> object:
        """1, 2 or a full site mapping of them (one error naming the form, not one per union
        member); ``{attention: 2, mlp: 2, head: 2}`` is ``2`` (one canonical form, one build hash)."""
        sites, expected = ("attention", "mlp", "head"), "1, 2 (int8 levels) or {attention: 1|2, mlp: 1|2, head: 1|2}"
        if _is_level(v):
            return v
        if not isinstance(v, dict):
            raise fail(Issue((), v, expected, "use 2"))
        if set(v) != set(sites):
            missing, extra = [k for k in sites if k not in v], [str(k) for k in v if k not in sites]
            fixes = (missing and f"add {', '.join(missing)}", extra and f"remove {', '.join(extra)}")
            raise fail(Issue((), v, expected, "; ".join(f for f in fixes if f)))
        if bad := next((k for k in sites if not _is_level(v[k])), None):
            raise fail(Issue((bad,), v[bad], "1 or 2 (int8 levels)", "use 2 (faithful) or 1 (faster)"))
        return v[sites[0]] if len(set(v.values())) == 1 else v


def _is_level(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x in (1, 2)


class EngineSpec(Spec):
    """How engines are built.

    ``layout`` (TensorRT): ``split`` = a prefill plan and a decode plan; ``dual_profile`` = one
    plan with a prefill and a decode optimization profile sharing one copy of the weights (needs
    the same precision in both phases; saves memory on Orin). ``plugin_free``: lower
    PagedAttention/Int4Gemm to standard TensorRT layers instead of plugins.
    ``orin_trt_lt_10_7``: what to do on an Orin whose TensorRT is older than 10.7 (JetPack 6, no
    Python plugins): build ``plugin_free`` or ``fail``. ``plugin_free_int4``: what the
    plugin-free lowering does with asymmetric INT4 weights (GGUF Q4_1), which TensorRT's INT4
    ``DequantizeLinear`` (symmetric only) cannot express: ``refuse`` (that variant is not built,
    the reason is printed), ``requantize_symmetric`` (symmetric INT4 blocks of the same group
    size, least-squares scale per block, re-quantized from the dequantized weights; measured on
    SmolLM2: teacher-forced agreement 0.772, too low) or ``dequantize_float`` (the dequantized
    weights in the activation dtype, fp16: 4x the INT4 weight bytes, agreement ~1). Either way
    the build measures the variant's teacher-forced agreement and keeps it only if it reaches
    ``validate.correctness.plugin_free_teacher_forced_agreement_min``. ``builder_optimization_level`` (0-5) and
    ``workspace_mib`` go to the TensorRT builder. ``intra_op_num_threads``: ONNX Runtime threads
    (cpu target only; None = ONNX Runtime's default). ``ort_accuracy_level`` (cpu only):
    MatMulNBits ``accuracy_level`` for INT4 weights, one value for both phases (``0``, the
    default) or one per phase (``{prefill: 0, decode: 4}``): 0 keeps fp32 activations (the
    reference's arithmetic: teacher-forced agreement 1.0 over the golden set), 4 quantizes each
    activation block to int8 (faster on some hosts; ~5e-3 relative error, which flips near-ties:
    the first token of the README's France prompt, top-2 fp32 logits 25.33 vs 25.24, on Zen 4
    and Intel hosts; and in decode tokens whose reference margin is up to 0.63 logits). The
    8-bit LM head with fp32 activations is lowered as two 4-bit GEMMs (ORT has no fp32-activation
    8-bit kernel; see ``plugins/ops/int4_gemm/lower_ort.py``). Different levels per phase mean two graphs and two ONNX
    Runtime sessions (``ort_sessions``), each with its own prepacked weights.
    ``ort_float_zero_points`` (cpu only): how INT4 blocks with float zero points (GGUF Q4_1,
    ``w = d*q + m``) run in ONNX Runtime, whose fast MatMulNBits takes integer zero points only:
    ``exact`` (default) runs MatMulNBits' symmetric kernel (implicit zero point 8) and adds a
    per-block correction term ``blocksum(A) @ (d*(8 - zp))`` (exact; ~2 ms of a ~11 ms SmolLM2
    decode step, measured by removing it; against the earlier form with explicit zero points 0:
    TPOT 0.88-0.93x, teacher-forced agreement 0.983 vs 0.950, on a Zen 3); ``int8`` re-codes them as 8-bit
    blocks with integer zero points (each weight moves by at most d/32, 1/32 of a 4-bit code
    step; twice the weight bytes; no correction term). Measured on SmolLM2 (2 cores, noisy host):
    int8 prefill ~10-15 % faster, decode within noise; teacher-forced agreement 0.978 vs 0.961,
    but it flips the near-tie first token of "What is the capital of France?" (fp32 logits
    25.33 vs 25.24), so the GGUF-exact form stays the default.
    ``ort_sessions`` (cpu only): ``one`` runs decode steps through the prefill graph in a single
    ONNX Runtime session. ORT prepacks the weights once per session, so this holds one packed
    copy instead of two (measured on SmolLM2: 219 vs 357 MiB resident after loading the exact
    Q4_1 artifact; peak 620 vs 794 MiB with the int8 form; TPOT within noise once ORT's
    memory-pattern planning is off for that session); needs the same precision in both phases.
    ``two`` loads the decode graph in its own session. ``auto`` = one when prefill and decode precisions are equal.
    ``cpu_backend`` (cpu only): ``native`` runs the host CPU kernels (``plugins/cpu``: Q4/Q8
    GEMMs on VNNI or AVX2, fused paged attention, one C call per step; needs GGUF Q4_0/Q4_1
    linears, a Q8_0 embedding and head, fp32 KV, a C compiler at build); ``ort`` ONNX Runtime
    only; ``auto`` (default) native where the model and build machine allow it, else ort (the
    reason printed). The ONNX graphs are built either way (``--engine ort`` runs them).
    ``cpu_isa`` (native): ``host`` (the build machine's best: avx512_vnni, else avx2),
    ``avx512_vnni`` or ``avx2`` (every x86-64 since 2015); recorded in the manifest; an artifact
    whose ISA the running CPU lacks is refused with the rebuild command.
    ``cpu_activation_levels`` (native): int8 levels of GEMM activations, one value or per phase:
    2 (default; ~1e-5 relative error: the reference's answers) or 1 (faster; flips near-ties), or
    per phase one per GEMM site, ``{attention: .., mlp: .., head: ..}`` (recipes/smollm2-135m-cpu-fast.yaml;
    docs/fidelity.md: the gate it holds on avx512_vnni kernels and misses on avx2 ones).
    ``ort_fused_steps`` (cpu only): a step that carries prompt chunks and decode tokens runs them
    in one call of the prefill graph (the decode tokens as trailing 1-token rows, which the graph
    then sends through a decode attention path instead of padding them to the longest chunk), so
    the weights are read once per mixed step. Measured on SmolLM2 (bench/fused_step.py, 2 cores,
    interleaved): a mixed step 0.82-0.98x the two calls; but every decode-only step pays for the
    graph's second, empty attention path (~1-2 ms, 6-10 %). On for budget-driven serving
    (``runtime.scheduler.policy: slo`` with a TPOT budget, where mixed steps are what the budget limits),
    off (the default) where decode-only TPOT matters most.
    """

    layout: Literal["split", "dual_profile"] = "split"
    plugin_free: bool = False
    orin_trt_lt_10_7: Literal["plugin_free", "fail"] = "fail"
    plugin_free_int4: Literal["refuse", "requantize_symmetric", "dequantize_float"] = "refuse"
    builder_optimization_level: int = Field(3, ge=0, le=5, examples=[3])
    workspace_mib: int | None = Field(None, ge=1, examples=[4096])
    intra_op_num_threads: int | None = Field(None, ge=1, examples=[2])
    ort_accuracy_level: PhaseAccuracyLevels = Field(
        default_factory=lambda: PhaseAccuracyLevels(prefill=0, decode=0), examples=[0, {"prefill": 0, "decode": 4}]
    )
    ort_float_zero_points: Literal["exact", "int8"] = "exact"
    ort_sessions: Literal["auto", "one", "two"] = "auto"
    ort_fused_steps: bool = False
    cpu_backend: Literal["auto", "native", "ort"] = "auto"
    cpu_isa: Literal["host", "avx512_vnni", "avx2"] = "host"
    cpu_activation_levels: PhaseActivationLevels = Field(
        default_factory=lambda: PhaseActivationLevels(prefill=2, decode=2), examples=[2, {"prefill": 2, "decode": 1}]
    )

    @field_validator("cpu_activation_levels", mode="before")
    @classmethod
    def _one_activation_level_for_both_phases(cls, v: object) -> object:
        """``cpu_activation_levels: 2`` is ``{prefill: 2, decode: 2}`` (one canonical form)."""
        if isinstance(v, dict):
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v not in (1, 2):
            raise fail(Issue((), v, "1 or 2 (int8 levels), or {prefill: .., decode: ..}", "use 2"))
        return {"prefill": v, "decode": v}

    @field_validator("ort_accuracy_level", mode="before")
    @classmethod
    def _one_level_for_both_phases(cls, v: object) -> object:
        """``ort_accuracy_level: 0`` is ``{prefill: 0, decode: 0}`` (one canonical form, one build hash)."""
        if isinstance(v, bool) or not isinstance(v, int):
            return v
        if v not in (0, 4):
            raise fail(
                Issue((), v, "0 (fp32 activations) or 4 (int8 activations), or {prefill: .., decode: ..}", "use 0")
            )
        return {"prefill": v, "decode": v}

    def accuracy_level(self, phase: Phase) -> int:
        """The MatMulNBits ``accuracy_level`` of ``phase`` (``ort_accuracy_level`` per phase)."""
        return getattr(self.ort_accuracy_level, phase)


TRT_ONLY_ENGINE_KEYS = (
    "layout",
    "plugin_free",
    "orin_trt_lt_10_7",
    "plugin_free_int4",
    "builder_optimization_level",
    "workspace_mib",
)


class ArchitectureSpec(Spec):
    """Architecture facts stated inline, for planning recipes without weights (``estimate``,
    memory plans). Field names and meanings follow :class:`ModelConfig`; ``sliding_window``
    applies to every layer (0 = full attention)."""

    architecture: Literal["llama", "mistral", "qwen2"] = "llama"
    name: str = ""
    num_layers: int = Field(ge=1, examples=[32])
    hidden_size: int = Field(ge=1, examples=[4096])
    num_heads: int = Field(ge=1, examples=[32])
    num_kv_heads: int = Field(ge=1, examples=[32])
    head_dim: int = Field(ge=1, examples=[128])
    intermediate_size: int = Field(ge=1, examples=[11008])
    vocab_size: int = Field(ge=1, examples=[32000])
    max_position_embeddings: int = Field(ge=1, examples=[4096])
    rope_theta: float = Field(10000.0, gt=0)
    rms_norm_eps: float = Field(1e-5, gt=0)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _gqa(self) -> ArchitectureSpec:
        if self.num_heads % self.num_kv_heads:
            raise fail(
                Issue(
                    ("num_kv_heads",),
                    self.num_kv_heads,
                    f"a divisor of num_heads ({self.num_heads}) (grouped-query "
                    "attention shares each KV head among num_heads/num_kv_heads heads)",
                    "copy num_key_value_heads from the model's config.json",
                )
            )
        return self

    def to_model_config(self) -> ModelConfig:
        """The facts as a :class:`ModelConfig` (no tokenizer facts: planning only)."""
        return ModelConfig(
            architecture=self.architecture,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            layer_sliding_window=(self.sliding_window,) * self.num_layers,
            name=self.name,
        )


class ModelSpec(Spec):
    """The model: ``source`` (shipped short name such as ``smollm2-135m``, a ``.gguf`` path or a
    Hugging Face folder; see :mod:`trtpipe.pipeline.recipe.model_source`) or, for planning recipes
    without weights, ``architecture`` facts inline with ``source`` omitted or ``none``."""

    source: str | None = Field(None, examples=["smollm2-135m"])
    architecture: ArchitectureSpec | None = None

    @property
    def has_weights(self) -> bool:
        """True when the recipe names a model file (not a planning-only recipe)."""
        return self.source is not None and self.source.strip().lower() != "none"

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if not self.has_weights and self.architecture is None:
            raise fail(
                Issue(
                    ("source",),
                    self.source if self.source else MISSING,
                    "a model: a shipped name, a .gguf file or a Hugging Face folder "
                    "(or model.architecture facts for a planning recipe)",
                    "add `source: smollm2-135m` (or a path) under model:",
                )
            )
        if self.has_weights and self.architecture is not None:
            raise fail(
                Issue(
                    ("architecture",),
                    self.architecture.model_dump(),
                    "no inline facts when model.source names a model (the facts come "
                    "from the model file; two sources of truth could disagree)",
                    "remove model.architecture, or set `source: none` for a planning-only recipe",
                )
            )
        return self
