"""The recipe: one YAML file per deployment, validated once at the edge.

A recipe states the model, the target, the precision of each phase (prefill and decode), the
paged KV cache, the scheduler limits, the TensorRT optimization profiles, the engine layout, and
the validate workload with its latency budgets. Everything downstream (export, lowering, build,
runtime limits, validate) reads the frozen :class:`Recipe`, never the YAML.

Errors: every problem is reported at once, each as one line::

    recipe x.yaml: kv_cache.block_size = 24: expected a power of two (...). Fix: use 16 or 32

Checks that need the model's facts (context length, hidden size) run in
:func:`check_recipe_against_model` once the loader has read the model; planning recipes that state
``model.architecture`` inline get them at load time.

Units are in the names: ``*_ms`` milliseconds, ``*_mib`` MiB (2**20 bytes), ``*_per_s`` per second,
``*_tokens`` / ``max_seq_len`` / ``max_num_tokens`` tokens.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Sequence, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from trtpipe.plugins.errors import TrtpipeError
from trtpipe.runtime.model_config import ModelConfig

if TYPE_CHECKING:
    from trtpipe.pipeline.model_source import ModelSource

Target = Literal["cpu", "orin", "a100", "h200"]
Precision = Literal["fp32", "fp16", "bf16", "int4"]
KVDtype = Literal["fp32", "fp16", "bf16"]
Phase = Literal["prefill", "decode"]

GPU_TARGETS: tuple[str, ...] = ("orin", "a100", "h200")
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"  # shipped recipes (source tree)
DEFAULT_RECIPE_NAME = "smollm2-135m-cpu"


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


MISSING: Any = _Missing()  # the value of a required key that is absent
NO_VALUE: Any = object()  # a problem about the file itself (not found, bad YAML): no key, no value


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class RecipeProblem:
    """One thing wrong with a recipe: the key path, the value found, what was expected, the fix."""

    path: str  # "kv_cache.block_size", "validate.scenarios[0].name"; "" for the file itself
    value: Any
    expected: str
    fix: str

    def render(self, origin: str) -> str:
        """``recipe <origin>: <path> = <value!r>: expected <expected>. Fix: <fix>``."""
        if self.value is NO_VALUE:
            head = f"recipe {origin}: " + (f"{self.path}: " if self.path else "")
        else:
            head = f"recipe {origin}: {self.path or '(recipe)'} = {_short_repr(self.value)}: "
        return f"{head}expected {self.expected}. Fix: {self.fix}"


class RecipeError(TrtpipeError, ValueError):
    """A recipe that cannot be used. ``problems`` lists every problem found; the message has one
    line per problem (see :meth:`RecipeProblem.render`)."""

    def __init__(self, origin: str, problems: Sequence[RecipeProblem]):
        self.origin = origin
        self.problems: tuple[RecipeProblem, ...] = tuple(problems)
        super().__init__("\n".join(p.render(origin) for p in self.problems))


class _Issue(NamedTuple):
    """A problem raised from inside a validator; ``path`` is relative to the validated object."""

    path: tuple[str | int, ...]
    value: Any
    expected: str
    fix: str


def _fail(*issues: _Issue) -> PydanticCustomError:
    # The issues ride in the error context; _problems_from_validation_error unpacks them so a
    # cross-field check can point at the exact key (pydantic would point at the whole model).
    return PydanticCustomError("recipe", "{summary}", {
        "summary": "; ".join(i.expected for i in issues), "issues": list(issues)})


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _nearest_pow2(n: int) -> tuple[int, int]:
    lo = 1 << max(0, n.bit_length() - 1)
    return lo, lo * 2


def _blocks_per_seq(max_seq_len: int, block_size: int) -> int:
    return -(-max_seq_len // block_size)


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------

class _Spec(BaseModel):
    # strict: YAML already types its scalars; "16" or true for an integer is a mistake, not a
    # value to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Int4Spec(_Spec):
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
        if v < 16 or not _is_pow2(v):
            lo, hi = _nearest_pow2(max(v, 16))
            raise _fail(_Issue((), v, "a power of two >= 16 (INT4 packs two codes per byte "
                                      "and the kernels tile groups by 16)",
                               f"use {max(lo, 16)} or {max(hi, 32)}"))
        return v


class PrecisionSpec(_Spec):
    """Precision of each phase. ``fp32``/``fp16``/``bf16``: weights and activations in that
    dtype. ``int4``: weight-only INT4 (``int4`` settings below); activations in fp32 on the cpu
    target and fp16 on GPU targets (see :meth:`Recipe.activation_dtype`)."""

    prefill: Precision = Field(examples=["fp16"])
    decode: Precision = Field(examples=["int4"])
    int4: Int4Spec = Field(default_factory=Int4Spec)


class KVCacheSpec(_Spec):
    """The paged KV pool shared by prefill and decode.

    ``block_size``: tokens per block (power of two). Size the pool with ``num_blocks`` (block 0
    is the null block, so ``num_blocks - 1`` are usable) or ``memory_budget_mib`` (K and V of all
    layers), not both; with neither, the pool holds ``max_batch_size`` full sequences (see
    :func:`plan_kv_num_blocks`). ``dtype``: None means the decode activation dtype.
    ``prefix_caching``: reuse the KV blocks of identical prompt prefixes across requests
    (automatic prefix caching, vLLM v1's scheme; outputs are unchanged). A runtime setting: it
    is not part of :func:`build_hash`, so turning it off needs no rebuild.
    """

    block_size: int = Field(16, ge=1, examples=[16])
    num_blocks: int | None = Field(None, ge=2, examples=[513])
    memory_budget_mib: float | None = Field(None, gt=0, examples=[2048])
    dtype: KVDtype | None = None
    prefix_caching: bool = True

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int) -> int:
        if not _is_pow2(v):
            lo, hi = _nearest_pow2(v)
            raise _fail(_Issue((), v, "a power of two (slots are block_id * block_size + "
                                      "position % block_size)", f"use {lo} or {hi}"))
        return v


class SchedulerSpec(_Spec):
    """How the runtime divides each step between prefill and decode (runtime settings: not part
    of :func:`build_hash`, no rebuild needed).

    ``policy``: ``slo`` sizes each step's prefill chunk from the engine's measured step-cost
    model so the step stays within the TPOT budget (Sarathi-Serve's token budget, never below
    one block); ``fcfs`` prefills up to ``max_num_tokens`` per step. ``tpot_budget_ms``: the
    budget ``slo`` keeps; None = each validate scenario's tightest ``tpot_ms`` budget (a scenario
    without one, and a server without this setting, run FCFS).
    """

    policy: Literal["slo", "fcfs"] = "slo"
    tpot_budget_ms: float | None = Field(None, gt=0, examples=[50])


class Range(_Spec):
    """One dimension of a TensorRT optimization profile: ``1 <= min <= opt <= max``.
    TensorRT tunes kernels for ``opt`` and accepts any size in ``[min, max]``."""

    min: int = Field(ge=1, examples=[1])
    opt: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.min > self.opt:
            raise _fail(_Issue(("min",), self.min, f"min <= opt ({self.opt})",
                               f"lower min to {self.opt} or less"))
        if self.opt > self.max:
            raise _fail(_Issue(("opt",), self.opt, f"opt <= max ({self.max})",
                               f"lower opt to {self.max} or less, or raise max"))
        return self


class PrefillProfile(_Spec):
    """Prefill profile: ``tokens`` in the packed batch (T) and ``sequences`` in it (S)."""

    tokens: Range
    sequences: Range

    @model_validator(mode="after")
    def _seqs_fit(self) -> "PrefillProfile":
        if self.sequences.max > self.tokens.max:
            raise _fail(_Issue(("sequences", "max"), self.sequences.max,
                               f"at most tokens.max ({self.tokens.max}): every sequence in a "
                               "prefill batch brings at least one token",
                               f"lower sequences.max to {self.tokens.max}"))
        return self


class DecodeProfile(_Spec):
    """Decode profile: ``batch`` = running sequences (S); ``context`` = tokens per sequence
    (sets the block-table width ``ceil(context.max / block_size)``)."""

    batch: Range
    context: Range


class ProfilesSpec(_Spec):
    """TensorRT optimization profiles per phase (GPU targets only). A phase left out gets
    profiles derived from the limits (see :meth:`Recipe.resolved_profiles`)."""

    prefill: PrefillProfile | None = None
    decode: DecodeProfile | None = None


class EngineSpec(_Spec):
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
    MatMulNBits ``accuracy_level`` for INT4 weights: 4 quantizes activations to int8 per block
    (faster; ~5e-3 relative error), 0 keeps fp32 activations (exact against the reference).
    ``ort_float_zero_points`` (cpu only): how INT4 blocks with float zero points (GGUF Q4_1,
    ``w = d*q + m``) run in ONNX Runtime, whose fast MatMulNBits takes integer zero points only:
    ``exact`` (default) adds a per-block correction term (exact; ~2 ms of a ~11 ms SmolLM2 decode
    step, measured by removing it); ``int8`` re-codes them as 8-bit
    blocks with integer zero points (each weight moves by at most d/32, 1/32 of a 4-bit code
    step; twice the weight bytes; no correction term). Measured on SmolLM2 (2 cores, noisy host):
    int8 prefill ~10-15 % faster, decode within noise; teacher-forced agreement 0.978 vs 0.961,
    but it flips the near-tie first token of "What is the capital of France?" (fp32 logits
    25.33 vs 25.24), so the GGUF-exact form stays the default.
    ``ort_sessions`` (cpu only): ``one`` runs decode steps through the prefill graph in a single
    ONNX Runtime session. ORT prepacks the weights once per session, so this holds one packed
    copy instead of two (measured on SmolLM2: 219 vs 357 MiB resident after loading the exact
    Q4_1 artifact; peak 620 vs 794 MiB with the int8 form; TPOT within noise once ORT's
    memory-pattern planning is off for that session); needs the same precision in both phases. ``two`` loads the decode graph in its own
    session. ``auto`` = one when prefill and decode precisions are equal.
    """

    layout: Literal["split", "dual_profile"] = "split"
    plugin_free: bool = False
    orin_trt_lt_10_7: Literal["plugin_free", "fail"] = "fail"
    plugin_free_int4: Literal["refuse", "requantize_symmetric", "dequantize_float"] = "refuse"
    builder_optimization_level: int = Field(3, ge=0, le=5, examples=[3])
    workspace_mib: int | None = Field(None, ge=1, examples=[4096])
    intra_op_num_threads: int | None = Field(None, ge=1, examples=[2])
    ort_accuracy_level: Literal[0, 4] = 4
    ort_float_zero_points: Literal["exact", "int8"] = "exact"
    ort_sessions: Literal["auto", "one", "two"] = "auto"


_TRT_ONLY_ENGINE_KEYS = ("layout", "plugin_free", "orin_trt_lt_10_7", "plugin_free_int4",
                         "builder_optimization_level", "workspace_mib")


class ArchitectureSpec(_Spec):
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
    def _gqa(self) -> "ArchitectureSpec":
        if self.num_heads % self.num_kv_heads:
            raise _fail(_Issue(("num_kv_heads",), self.num_kv_heads,
                               f"a divisor of num_heads ({self.num_heads}) (grouped-query "
                               "attention shares each KV head among num_heads/num_kv_heads heads)",
                               "copy num_key_value_heads from the model's config.json"))
        return self

    def to_model_config(self) -> ModelConfig:
        """The facts as a :class:`ModelConfig` (no tokenizer facts: planning only)."""
        return ModelConfig(
            architecture=self.architecture, num_layers=self.num_layers,
            hidden_size=self.hidden_size, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps, tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            layer_sliding_window=(self.sliding_window,) * self.num_layers, name=self.name)


class ModelSpec(_Spec):
    """The model: ``source`` (shipped short name such as ``smollm2-135m``, a ``.gguf`` path or a
    Hugging Face folder; see :mod:`trtpipe.pipeline.model_source`) or, for planning recipes
    without weights, ``architecture`` facts inline with ``source`` omitted or ``none``."""

    source: str | None = Field(None, examples=["smollm2-135m"])
    architecture: ArchitectureSpec | None = None

    @property
    def has_weights(self) -> bool:
        """True when the recipe names a model file (not a planning-only recipe)."""
        return self.source is not None and self.source.strip().lower() != "none"

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if not self.has_weights and self.architecture is None:
            raise _fail(_Issue(("source",), self.source if self.source else MISSING,
                               "a model: a shipped name, a .gguf file or a Hugging Face folder "
                               "(or model.architecture facts for a planning recipe)",
                               "add `source: smollm2-135m` (or a path) under model:"))
        if self.has_weights and self.architecture is not None:
            raise _fail(_Issue(("architecture",), self.architecture.model_dump(),
                               "no inline facts when model.source names a model (the facts come "
                               "from the model file; two sources of truth could disagree)",
                               "remove model.architecture, or set `source: none` for a "
                               "planning-only recipe"))
        return self


class UniformTokens(_Spec):
    """Lengths drawn uniformly from ``[min, max]`` tokens (both inclusive)."""

    min: int = Field(ge=1, examples=[32])
    max: int = Field(ge=1, examples=[128])

    @model_validator(mode="after")
    def _ordered(self) -> "UniformTokens":
        if self.min > self.max:
            raise _fail(_Issue(("min",), self.min, f"min <= max ({self.max})",
                               "swap min and max"))
        return self


def _int_shorthand(value: Any) -> Any:
    # `prompt_tokens: 128` means `prompt_tokens: {fixed: 128}`.
    if isinstance(value, int) and not isinstance(value, bool):
        return {"fixed": value}
    return value


class OutputTokens(_Spec):
    """Output lengths in tokens: ``fixed: n`` (or just ``n``) or ``uniform: {min, max}``.
    Generation is forced to that length (EOS ignored) so runs are comparable."""

    fixed: int | None = Field(None, ge=1, examples=[64])
    uniform: UniformTokens | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _int_shorthand(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> "OutputTokens":
        given = [k for k in ("fixed", "uniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _fail(_Issue((), {k: getattr(self, k) for k in given} or MISSING,
                               "exactly one of fixed or uniform",
                               "write e.g. `output_tokens: 64` or "
                               "`output_tokens: {uniform: {min: 16, max: 64}}`"))
        return self

    @property
    def max_tokens(self) -> int:
        """The largest length this spec can produce."""
        if self.fixed is not None:
            return self.fixed
        assert self.uniform is not None  # _exactly_one
        return self.uniform.max


class PromptTokens(_Spec):
    """Prompt lengths in tokens: ``fixed: n`` (or just ``n``), ``uniform: {min, max}``, or
    ``file``: a prompt file (path resolved against the recipe's folder, then the CWD) whose
    prompts are used as written."""

    fixed: int | None = Field(None, ge=1, examples=[128])
    uniform: UniformTokens | None = None
    file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _int_shorthand(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> "PromptTokens":
        given = [k for k in ("fixed", "uniform", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _fail(_Issue((), {k: getattr(self, k) for k in given} or MISSING,
                               "exactly one of fixed, uniform or file",
                               "write e.g. `prompt_tokens: 128` or "
                               "`prompt_tokens: {uniform: {min: 32, max: 128}}`"))
        return self

    @property
    def max_tokens(self) -> int | None:
        """The longest prompt this spec can produce; None for a prompt file (known after
        tokenization)."""
        if self.fixed is not None:
            return self.fixed
        return self.uniform.max if self.uniform is not None else None


Percentile = Literal["p50", "p90", "p95", "p99"]


class PercentileBudget(_Spec):
    """Upper limits on a latency percentile (same unit as the metric, ms). At least one."""

    p50: float | None = Field(None, gt=0, examples=[100])
    p90: float | None = Field(None, gt=0, examples=[100])
    p95: float | None = Field(None, gt=0, examples=[100])
    p99: float | None = Field(None, gt=0, examples=[100])

    @model_validator(mode="after")
    def _at_least_one(self) -> "PercentileBudget":
        if all(getattr(self, p) is None for p in get_args(Percentile)):
            raise _fail(_Issue((), MISSING, "at least one of p50, p90, p95, p99",
                               "add e.g. `p95: 500`, or remove this metric"))
        return self

    def items(self) -> list[tuple[str, float]]:
        """``[(percentile, limit)]`` for the percentiles that are set, in p50..p99 order."""
        return [(p, v) for p in get_args(Percentile) if (v := getattr(self, p)) is not None]


class Budgets(_Spec):
    """Latency budgets of a scenario (see DESIGN.md "Metrics" for the definitions):
    ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` over requests, ``itl_ms`` over tokens, each with
    percentile limits; ``min_output_tokens_per_s``: lower limit on output throughput (output
    tokens of measured requests / wall time of the measured phase)."""

    ttft_ms: PercentileBudget | None = None
    tpot_ms: PercentileBudget | None = None
    itl_ms: PercentileBudget | None = None
    e2e_ms: PercentileBudget | None = None
    min_output_tokens_per_s: float | None = Field(None, gt=0, examples=[100])

    def limits(self) -> list[tuple[str, str, float]]:
        """Latency limits as ``[(metric, percentile, limit_ms)]``, e.g.
        ``("ttft_ms", "p95", 1500.0)``; the throughput floor is not included."""
        out: list[tuple[str, str, float]] = []
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            spec = getattr(self, metric)
            if spec is not None:
                out.extend((metric, p, v) for p, v in spec.items())
        return out

    def budget_dicts(self) -> list[dict[str, Any]]:
        """The budgets in :func:`trtpipe.runtime.budgets.parse_budget`'s form:
        ``{"metric": "ttft_ms", "percentile": "p95", "max": 1500.0}`` per latency limit, then
        ``{"metric": "output_tokens_per_s", "min": x}`` for the throughput floor."""
        out: list[dict[str, Any]] = [{"metric": m, "percentile": p, "max": v}
                                     for m, p, v in self.limits()]
        if self.min_output_tokens_per_s is not None:
            out.append({"metric": "output_tokens_per_s", "min": self.min_output_tokens_per_s})
        return out


class Scenario(_Spec):
    """One validate workload: ``num_requests`` measured requests after ``num_warmup_requests``
    excluded ones, with prompt and output lengths drawn with ``seed``, arriving either in a
    closed loop of ``concurrency`` clients or as a Poisson process of ``arrival_rate_per_s``
    (exactly one of the two).

    ``system_prompt_tokens``: every prompt starts with the same system prompt of this many corpus
    tokens (a shared prefix: what prefix caching saves); the drawn ``prompt_tokens`` are then the
    user turn. ``chat``: wrap system prompt and user turn in the model's chat template."""

    name: str = Field(examples=["chat"])
    description: str = ""
    num_requests: int = Field(ge=1, examples=[16])
    num_warmup_requests: int = Field(2, ge=0, examples=[2])
    prompt_tokens: PromptTokens
    output_tokens: OutputTokens
    concurrency: int | None = Field(None, ge=1, examples=[4])
    arrival_rate_per_s: float | None = Field(None, gt=0, examples=[2.0])
    seed: int = 0
    system_prompt_tokens: int | None = Field(None, ge=1, examples=[256])
    chat: bool = False
    budgets: Budgets = Field(default_factory=Budgets)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v)

    @model_validator(mode="after")
    def _arrivals(self) -> "Scenario":
        if (self.concurrency is None) == (self.arrival_rate_per_s is None):
            both = self.concurrency is not None
            raise _fail(_Issue(("concurrency",), self.concurrency if both else MISSING,
                               "exactly one of concurrency (closed loop) or arrival_rate_per_s "
                               "(Poisson arrivals)",
                               "remove one of them" if both else "add e.g. `concurrency: 4`"))
        return self


class CorrectnessSpec(_Spec):
    """Correctness gate of validate: run ``num_sequences`` reference continuations of
    ``num_tokens`` tokens teacher-forced through the INT4 engines and the full-precision
    reference; the fraction of positions whose argmax agrees must be at least
    ``int4_teacher_forced_agreement_min``. ``plugin_free_teacher_forced_agreement_min``: the
    same gate for the plugin-free variant whose asymmetric INT4 weights were changed for
    TensorRT (``engine.plugin_free_int4``: re-quantized or dequantized), applied when the build measures it
    (on the CPU, against the fp32 reference) and by validate on an artifact of that variant."""

    int4_teacher_forced_agreement_min: float = Field(0.95, gt=0, le=1, examples=[0.95])
    plugin_free_teacher_forced_agreement_min: float | None = Field(None, gt=0, le=1, examples=[0.9])
    num_sequences: int = Field(4, ge=1, examples=[4])
    num_tokens: int = Field(64, ge=1, examples=[64])


class ValidateSpec(_Spec):
    """What ``trtpipe validate`` runs: scenarios (unique names) and the correctness gate."""

    scenarios: tuple[Scenario, ...] = Field((), strict=False)
    correctness: CorrectnessSpec | None = None

    @model_validator(mode="after")
    def _unique(self) -> "ValidateSpec":
        seen: set[str] = set()
        for i, s in enumerate(self.scenarios):
            if s.name in seen:
                raise _fail(_Issue(("scenarios", i, "name"), s.name, "a name not used by an "
                                   "earlier scenario", "rename this scenario"))
            seen.add(s.name)
        return self

    def scenario(self, name: str) -> Scenario:
        """The scenario called ``name``; :class:`RecipeError` listing the names otherwise."""
        for s in self.scenarios:
            if s.name == name:
                return s
        names = [s.name for s in self.scenarios]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"use one of {names}"
        problem = RecipeProblem("validate.scenarios", name,
                                "the name of a scenario of this recipe", hint)
        raise RecipeError("<recipe>", [problem])


def _check_name(v: str) -> str:
    ok = bool(v) and (v[0].isalnum() and all(c.isalnum() or c in "._-" for c in v))
    if not ok:
        raise _fail(_Issue((), v, "a non-empty name of letters, digits, '.', '_' or '-' "
                                  "(it becomes a folder name)",
                           "e.g. `smollm2-135m-cpu`"))
    return v


class Recipe(_Spec):
    """A validated deployment recipe. Build it with :func:`load_recipe` or :func:`parse_recipe`.

    Limits: ``max_seq_len`` tokens per sequence (prompt + output), ``max_batch_size`` running
    sequences per decode step, ``max_num_tokens`` tokens per prefill step (chunked prefill packs
    up to this many). ``sliding_window``: None keeps the model's window, 0 turns it off, n > 0
    sets an n-token window on every layer (an approximation for full-attention models).
    """

    name: str = Field(examples=["smollm2-135m-cpu"])
    description: str = ""
    model: ModelSpec
    target: Target = Field(examples=["cpu"])
    precision: PrecisionSpec
    kv_cache: KVCacheSpec = Field(default_factory=KVCacheSpec)
    sliding_window: int | None = Field(None, ge=0, examples=[4096])
    max_seq_len: int = Field(2048, ge=1, examples=[2048])
    max_batch_size: int = Field(8, ge=1, examples=[8])
    max_num_tokens: int = Field(512, ge=1, examples=[512])
    profiles: ProfilesSpec | None = None
    engine: EngineSpec = Field(default_factory=EngineSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    # "validate" would shadow BaseModel.validate; the YAML key stays "validate".
    validation: ValidateSpec = Field(default_factory=ValidateSpec, alias="validate")

    _origin: str = PrivateAttr(default="<recipe>")
    _base_dir: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Recipe":
        issues = _recipe_issues(self)
        if self.model.architecture is not None:
            issues += _model_issues(self, self.model.architecture.to_model_config(),
                                    "model.architecture")
        if issues:
            raise _fail(*issues)
        return self

    # -- where it came from ------------------------------------------------------------------
    @property
    def origin(self) -> str:
        """The recipe file (as given to :func:`load_recipe`), or ``<recipe>``; used in errors."""
        return self._origin

    @property
    def base_dir(self) -> Path | None:
        """The recipe file's folder: relative paths in the recipe are resolved against it."""
        return self._base_dir

    def resolve_source(self) -> "ModelSource":
        """Resolve ``model.source`` (:func:`resolve_model_source`); RecipeError if missing."""
        from trtpipe.pipeline.model_source import resolve_model_source

        return resolve_model_source(self.model.source, self._base_dir, origin=self._origin)

    def resolve_path(self, path: str) -> Path:
        """A path written in the recipe: absolute as is; relative against the recipe's folder
        if it exists there, else the CWD, else (for messages) the recipe's folder."""
        p = Path(path).expanduser()
        if p.is_absolute():
            return p
        bases = [b for b in (self._base_dir, Path.cwd()) if b is not None]
        for base in bases:
            if (base / p).exists():
                return (base / p).resolve()
        return (bases[0] / p).resolve()

    # -- derived settings --------------------------------------------------------------------
    @property
    def uses_int4(self) -> bool:
        """True when either phase runs INT4 weights."""
        return "int4" in (self.precision.prefill, self.precision.decode)

    def activation_dtype(self, phase: Phase) -> KVDtype:
        """Activation dtype of a phase: its precision, or for ``int4`` (weight-only) fp32 on
        the cpu target and fp16 on GPU targets."""
        p = getattr(self.precision, phase)
        if p == "int4":
            return "fp32" if self.target == "cpu" else "fp16"
        return p

    @property
    def kv_dtype(self) -> KVDtype:
        """KV pool dtype: ``kv_cache.dtype`` or, when unset, the decode activation dtype."""
        return self.kv_cache.dtype or self.activation_dtype("decode")

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table width MB = ceil(max_seq_len / block_size)."""
        return _blocks_per_seq(self.max_seq_len, self.kv_cache.block_size)

    def resolved_profiles(self) -> ProfilesSpec:
        """The optimization profiles to build: the recipe's, with a phase left out derived
        from the limits (min 1, max = the limit, opt = a typical size)."""
        given = self.profiles or ProfilesSpec()
        prefill = given.prefill or PrefillProfile(
            tokens=Range(min=1, opt=min(self.max_num_tokens, 512), max=self.max_num_tokens),
            sequences=Range(min=1, opt=1, max=min(self.max_batch_size, self.max_num_tokens)))
        decode = given.decode or DecodeProfile(
            batch=Range(min=1, opt=max(1, self.max_batch_size // 2), max=self.max_batch_size),
            context=Range(min=1, opt=min(self.max_seq_len, 1024), max=self.max_seq_len))
        return ProfilesSpec(prefill=prefill, decode=decode)


# --------------------------------------------------------------------------------------------
# Cross-field checks
# --------------------------------------------------------------------------------------------

def _recipe_issues(r: Recipe) -> list[_Issue]:
    """Checks that need several keys but not the model's facts."""
    out: list[_Issue] = []
    kv = r.kv_cache
    if r.sliding_window is not None and r.sliding_window > r.max_seq_len:
        out.append(_Issue(("sliding_window",), r.sliding_window,
                          f"at most max_seq_len ({r.max_seq_len}); a wider window never "
                          "drops a key",
                          f"lower sliding_window to {r.max_seq_len} or less, or remove it to "
                          "keep the model's window"))
    if kv.num_blocks is not None and kv.memory_budget_mib is not None:
        out.append(_Issue(("kv_cache", "num_blocks"), kv.num_blocks,
                          "either kv_cache.num_blocks or kv_cache.memory_budget_mib, not both",
                          "remove one of them"))
    elif kv.num_blocks is not None:
        need = r.max_blocks_per_seq + 1
        if kv.num_blocks < need:
            out.append(_Issue(("kv_cache", "num_blocks"), kv.num_blocks,
                              f"at least {need} (one max_seq_len={r.max_seq_len} sequence in "
                              f"blocks of {kv.block_size}, plus the null block 0)",
                              f"raise num_blocks to >= {need} or lower max_seq_len"))

    if r.target == "cpu":
        for phase in ("prefill", "decode"):
            if getattr(r.precision, phase) == "bf16":
                out.append(_Issue(("precision", phase), "bf16",
                                  "fp32, fp16 or int4 on the cpu target (ONNX Runtime's CPU "
                                  "provider has no bf16 MatMul kernels)",
                                  f"use `{phase}: fp32` or `{phase}: int4`"))
        if kv.dtype == "bf16":
            out.append(_Issue(("kv_cache", "dtype"), "bf16", "fp32 or fp16 on the cpu target",
                              "use `dtype: fp32`"))
        if r.engine.ort_sessions == "one" and r.precision.prefill != r.precision.decode:
            out.append(_Issue(("engine", "ort_sessions"), "one",
                              "the same precision in both phases (decode runs through the prefill "
                              f"graph), got prefill={r.precision.prefill} and decode={r.precision.decode}",
                              "use `ort_sessions: two` (or auto), or set both phases to one precision"))
        if r.profiles is not None:
            out.append(_Issue(("profiles",), r.profiles.model_dump(exclude_none=True),
                              "no optimization profiles on the cpu target (ONNX Runtime "
                              "graphs take any shape)",
                              "remove profiles, or pick a GPU target (orin, a100, h200)"))
        for key in _TRT_ONLY_ENGINE_KEYS:
            if key in r.engine.model_fields_set:
                out.append(_Issue(("engine", key), getattr(r.engine, key),
                                  "no TensorRT settings on the cpu target (it builds ONNX "
                                  "Runtime graphs)",
                                  f"remove engine.{key}, or pick a GPU target"))
    else:
        if r.engine.intra_op_num_threads is not None:
            out.append(_Issue(("engine", "intra_op_num_threads"), r.engine.intra_op_num_threads,
                              "no ONNX Runtime thread count on GPU targets",
                              "remove engine.intra_op_num_threads, or use target: cpu"))
        for key in ("ort_accuracy_level", "ort_float_zero_points", "ort_sessions"):
            if key in r.engine.model_fields_set:
                out.append(_Issue(("engine", key), getattr(r.engine, key),
                                  "no ONNX Runtime settings on GPU targets (they build TensorRT plans)",
                                  f"remove engine.{key}, or use target: cpu"))
        if r.target != "orin" and "orin_trt_lt_10_7" in r.engine.model_fields_set:
            out.append(_Issue(("engine", "orin_trt_lt_10_7"), r.engine.orin_trt_lt_10_7,
                              f"this key only on target orin (this recipe targets {r.target})",
                              "remove engine.orin_trt_lt_10_7"))
        out += _plugin_free_int4_issues(r)
        if r.engine.layout == "dual_profile" and r.precision.prefill != r.precision.decode:
            out.append(_Issue(("engine", "layout"), "dual_profile",
                              "the same precision for prefill and decode (one plan, one copy of "
                              f"the weights), got prefill={r.precision.prefill} and "
                              f"decode={r.precision.decode}",
                              "use `layout: split`, or set both phases to one precision"))
        out += _profile_issues(r)

    for i, s in enumerate(r.validation.scenarios):
        longest = s.prompt_tokens.max_tokens
        if longest is not None and longest + s.output_tokens.max_tokens > r.max_seq_len:
            out.append(_Issue(("validate", "scenarios", i, "prompt_tokens"), longest,
                              f"longest prompt + longest output ({longest} + "
                              f"{s.output_tokens.max_tokens}) <= max_seq_len ({r.max_seq_len})",
                              "shorten the prompts or outputs, or raise max_seq_len"))
    return out


def _plugin_free_int4_issues(r: Recipe) -> list[_Issue]:
    """engine.plugin_free_int4 and its agreement gate come together, on a recipe that has a
    plugin-free INT4 variant."""
    out: list[_Issue] = []
    e = r.engine
    c = r.validation.correctness
    gate = c.plugin_free_teacher_forced_agreement_min if c is not None else None
    gate_key = ("validate", "correctness", "plugin_free_teacher_forced_agreement_min")
    if e.plugin_free_int4 != "refuse":
        has_variant = e.plugin_free or (r.target == "orin" and e.orin_trt_lt_10_7 == "plugin_free")
        if not has_variant:
            out.append(_Issue(("engine", "plugin_free_int4"), e.plugin_free_int4,
                              "a recipe with a plugin-free variant (engine.plugin_free: true, or on orin "
                              "engine.orin_trt_lt_10_7: plugin_free)",
                              "remove engine.plugin_free_int4, or add a plugin-free variant"))
        elif "int4" not in (r.precision.prefill, r.precision.decode):
            out.append(_Issue(("engine", "plugin_free_int4"), e.plugin_free_int4,
                              "an INT4 phase (there are no INT4 weights to re-quantize)",
                              "remove engine.plugin_free_int4"))
        elif gate is None:
            out.append(_Issue(gate_key, None,
                              f"a minimum teacher-forced agreement (0..1] for the plugin-free variant "
                              f"({e.plugin_free_int4}): it changes the weights, so the build measures it and "
                              "keeps the variant only above this gate",
                              "set validate.correctness.plugin_free_teacher_forced_agreement_min, e.g. 0.9"))
    elif gate is not None:
        out.append(_Issue(gate_key, gate,
                          "this key only with engine.plugin_free_int4: requantize_symmetric or "
                          "dequantize_float (it gates the plugin-free variant whose weights they change)",
                          "remove it, or set engine.plugin_free_int4: dequantize_float"))
    return out


def _profile_issues(r: Recipe) -> list[_Issue]:
    p = r.profiles
    if p is None:
        return []
    out: list[_Issue] = []
    # The scheduler may hand the engines anything up to the limits, so the profiles must accept
    # it; checked here so the user never meets a TensorRT shape error at run time.
    checks: list[tuple[Any, tuple[str, ...], int, str]] = []
    if p.prefill is not None:
        checks.append((p.prefill.tokens.max, ("prefill", "tokens", "max"), r.max_num_tokens,
                       "max_num_tokens"))
    if p.decode is not None:
        checks.append((p.decode.batch.max, ("decode", "batch", "max"), r.max_batch_size,
                       "max_batch_size"))
        checks.append((p.decode.context.max, ("decode", "context", "max"), r.max_seq_len,
                       "max_seq_len"))
    for value, path, limit, limit_name in checks:
        if value < limit:
            out.append(_Issue(("profiles",) + path, value,
                              f"at least {limit_name} ({limit}): the scheduler may send that "
                              "many",
                              f"raise profiles.{'.'.join(path)} to {limit} or lower {limit_name}"))
    return out


def _int4_group_candidates(dims: Sequence[int]) -> list[int]:
    g = math.gcd(*dims)
    return [c for c in (16, 32, 64, 128, 256) if g % c == 0]


def _model_issues(r: Recipe, config: ModelConfig, facts: str) -> list[_Issue]:
    """Checks that need the model's facts; ``facts`` names where they came from."""
    out: list[_Issue] = []
    ctx = config.max_position_embeddings
    if r.max_seq_len > ctx:
        out.append(_Issue(("max_seq_len",), r.max_seq_len,
                          f"at most the model's context length {ctx} "
                          f"(max_position_embeddings, from {facts})",
                          f"lower max_seq_len to {ctx} or less"))
    if r.uses_int4:
        g = r.precision.int4.group_size
        # K of every quantized GEMM: q/k/v/gate/up (hidden), o_proj (heads*head_dim), down (ffn).
        dims = {"hidden_size": config.hidden_size,
                "num_heads*head_dim": config.num_heads * config.head_dim,
                "intermediate_size": config.intermediate_size}
        bad = {k: v for k, v in dims.items() if v % g}
        if bad:
            cands = _int4_group_candidates(list(dims.values()))
            fix = (f"use group_size {' or '.join(map(str, cands))}" if cands else
                   "this model's sizes admit no power-of-two group >= 16; use fp16 or fp32")
            which = ", ".join(f"{k}={v}" for k, v in bad.items())
            out.append(_Issue(("precision", "int4", "group_size"), g,
                              f"a divisor of every INT4 GEMM's K; {which} (from {facts}) is not "
                              f"a multiple of {g}", fix))
    if r.kv_cache.memory_budget_mib is not None:
        need = r.max_blocks_per_seq + 1
        per_block = r.kv_cache.block_size * config.kv_bytes_per_token(DTYPE_BYTES[r.kv_dtype])
        have = int(r.kv_cache.memory_budget_mib * 2**20 // per_block)
        if have < need:
            need_mib = math.ceil(need * per_block / 2**20)
            out.append(_Issue(("kv_cache", "memory_budget_mib"), r.kv_cache.memory_budget_mib,
                              f"room for one max_seq_len={r.max_seq_len} sequence plus the null "
                              f"block ({need} blocks of {per_block} bytes = {need_mib} MiB); it "
                              f"holds {have}", f"raise memory_budget_mib to >= {need_mib} or "
                                               "lower max_seq_len"))
    return out


def build_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the recipe's build-relevant fields: all but ``description``,
    ``kv_cache.prefix_caching`` and ``scheduler`` (runtime settings) and the ``validate`` section (scenarios, budgets and the correctness threshold do not change what
    ``trtpipe build`` writes; ``validate.correctness.num_tokens`` only sets the golden length,
    which :func:`check_correctness` reads from golden.json itself)."""
    d = recipe.model_dump(mode="json", by_alias=True)
    d.pop("validate", None)
    d.pop("description", None)
    d["kv_cache"].pop("prefix_caching", None)  # runtime settings: the same artifact serves both
    d.pop("scheduler", None)
    canon = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def plan_kv_num_blocks(recipe: Recipe, config: ModelConfig) -> int:
    """Number of KV blocks in the pool, null block 0 included.

    ``kv_cache.num_blocks`` if set; else ``floor(memory_budget_mib * 2**20 / (block_size *
    kv_bytes_per_token))``; else room for ``max_batch_size`` sequences of ``max_seq_len``:
    ``max_batch_size * ceil(max_seq_len / block_size) + 1``.
    """
    kv = recipe.kv_cache
    if kv.num_blocks is not None:
        return kv.num_blocks
    if kv.memory_budget_mib is not None:
        per_block = kv.block_size * config.kv_bytes_per_token(DTYPE_BYTES[recipe.kv_dtype])
        return int(kv.memory_budget_mib * 2**20 // per_block)
    return recipe.max_batch_size * recipe.max_blocks_per_seq + 1


def check_recipe_against_model(recipe: Recipe, config: ModelConfig) -> None:
    """Check the recipe against the model's facts (from the GGUF / config.json loader).

    Raises :class:`RecipeError` listing: ``max_seq_len`` beyond ``max_position_embeddings``;
    an INT4 ``group_size`` that does not divide hidden size, heads*head_dim or intermediate
    size; a ``kv_cache.memory_budget_mib`` too small for one sequence.
    """
    issues = _model_issues(recipe, config, f"the model {config.name or recipe.model.source}")
    if issues:
        raise RecipeError(recipe.origin, [_issue_to_problem((), i) for i in issues])


# --------------------------------------------------------------------------------------------
# ValidationError -> RecipeError
# --------------------------------------------------------------------------------------------

def _format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _issue_to_problem(loc: tuple, issue: _Issue) -> RecipeProblem:
    return RecipeProblem(_format_path(loc + tuple(issue.path)), issue.value, issue.expected,
                         issue.fix)


def _unwrap(ann: Any) -> Any:
    """``X | None`` -> X; ``tuple[X, ...]`` / ``list[X]`` stay as they are."""
    if get_origin(ann) in (Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


def _field_by_key(cls: type[BaseModel], key: str) -> Any:
    for name, info in cls.model_fields.items():
        if (info.alias or name) == key:
            return info
    return None


def _lookup(loc: Sequence[str | int]) -> tuple[Any, Any]:
    """Walk the schema along ``loc``: (FieldInfo of the last key or None, annotation there)."""
    ann: Any = Recipe
    info = None
    for part in loc:
        ann = _unwrap(ann)
        if isinstance(part, int):
            args = get_args(ann)
            ann = args[0] if args else None
            continue
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None, None
        info = _field_by_key(ann, part)
        if info is None:
            return None, None
        ann = info.annotation
    return info, _unwrap(ann)


def _keys_of(ann: Any) -> list[str]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [info.alias or name for name, info in ann.model_fields.items()]
    return []


def _example(loc: Sequence[str | int], info: Any) -> str:
    key = next((p for p in reversed(loc) if isinstance(p, str)), "")
    if info is not None and info.examples:
        ex = info.examples[0]
        return f"`{key}: {ex}`"
    return ""


def _explain(e: dict[str, Any]) -> tuple[str, str]:
    """(expected, fix) for one of pydantic's built-in error types."""
    loc, typ, ctx = tuple(e["loc"]), e["type"], e.get("ctx") or {}
    info, ann = _lookup(loc)
    example = _example(loc, info)
    eg = f", e.g. {example}" if example else ""
    key = _format_path(loc)

    if typ == "missing":
        return "a value (this key is required)", f"add {example or f'`{loc[-1]}: ...`'}"
    if typ == "extra_forbidden":
        _, parent = _lookup(loc[:-1])
        allowed = _keys_of(parent)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        fix = (f"did you mean '{close[0]}'? Rename the key" if close
               else "remove the key, or check its indentation")
        where = _format_path(loc[:-1]) or "the top level"
        return f"a known key at {where} ({', '.join(allowed)})", fix
    if typ == "literal_error":
        options = [str(a) for a in get_args(ann)] if get_origin(ann) is Literal else []
        expected = ("one of " + ", ".join(repr(o) for o in options)) if options else \
            f"one of {ctx.get('expected')}"
        close = difflib.get_close_matches(str(e["input"]), options, n=1, cutoff=0.5)
        fix = f"did you mean '{close[0]}'?" if close else f"use {expected}"
        return expected, fix
    if typ in ("int_type", "int_parsing", "int_from_float"):
        return "an integer", f"write a whole number without quotes{eg}"
    if typ in ("float_type", "float_parsing", "finite_number"):
        value = e.get("input")
        if isinstance(value, str) and "e" in value.lower() and "." not in value:
            try:
                float(value)
            except ValueError:
                pass
            else:  # YAML 1.1 reads 1e-5 as a string: the mantissa needs a dot
                return "a number", f"write {value} as {value.lower().replace('e', '.0e', 1)}"
        return "a number", f"write a number without quotes{eg}"
    if typ in ("bool_type", "bool_parsing"):
        return "true or false", "write true or false without quotes"
    if typ == "string_type":
        return "a string", f"quote the value{eg}"
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[typ]
        bound = next(iter(ctx.values()), "?")
        positive = op in (">", ">=") and bound in (0, 1)
        return (f"a value {op} {bound}",
                (f"use a positive value{eg}" if positive else f"use a value {op} {bound}{eg}"))
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        keys = _keys_of(ann)
        hint = f" (keys: {', '.join(keys)})" if keys else ""
        return f"a mapping{hint}", f"write `{loc[-1] if loc else 'key'}:` followed by indented " \
                                   "`key: value` lines"
    if typ in ("tuple_type", "list_type"):
        return "a list", "write one `- item` per line under the key"
    return e.get("msg", "a valid value"), f"correct {key}{eg}"


def _problems_from_validation_error(err: ValidationError) -> list[RecipeProblem]:
    out: list[RecipeProblem] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "recipe":
            out.extend(_issue_to_problem(loc, i) for i in e["ctx"]["issues"])
            continue
        expected, fix = _explain(e)
        value = MISSING if e["type"] == "missing" else e.get("input")
        out.append(RecipeProblem(_format_path(loc), value, expected, fix))
    return out


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode,
                              deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # unhashable key: let SafeLoader report it
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first set at line {first + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_unique_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> RecipeProblem:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc)
    return RecipeProblem(where, NO_VALUE, f"valid YAML ({what})",
                         "fix the YAML there (indent with spaces, `key: value`, each key once)")


def parse_recipe(data: Any, *, origin: str = "<recipe>", base_dir: Path | None = None,
                 check_files: bool = False) -> Recipe:
    """Validate already-parsed YAML data (a dict) into a :class:`Recipe`.

    ``origin`` names the recipe in errors; ``base_dir`` is where relative paths are resolved.
    With ``check_files`` the model source and prompt files must exist. Raises
    :class:`RecipeError` listing every problem.
    """
    if not isinstance(data, dict):
        raise RecipeError(origin, [RecipeProblem("", data, "a mapping of keys at the top level "
                                                 "(name, model, target, precision, ...)",
                                                 f"start from recipes/{DEFAULT_RECIPE_NAME}.yaml")])
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(origin, _problems_from_validation_error(err)) from None
    recipe._origin = origin
    recipe._base_dir = base_dir
    if check_files:
        _check_files(recipe)
    return recipe


def _check_files(recipe: Recipe) -> None:
    problems: list[RecipeProblem] = []
    try:
        recipe.resolve_source()
    except RecipeError as err:
        problems.extend(err.problems)
    for i, s in enumerate(recipe.validation.scenarios):
        f = s.prompt_tokens.file
        if f is not None and not recipe.resolve_path(f).is_file():
            problems.append(RecipeProblem(f"validate.scenarios[{i}].prompt_tokens.file", f,
                                          f"an existing prompt file ({recipe.resolve_path(f)})",
                                          "fix the path (relative to the recipe's folder)"))
    if problems:
        raise RecipeError(recipe.origin, problems)


def load_recipe(path: str | Path, *, check_files: bool = True) -> Recipe:
    """Read, parse and validate a recipe YAML file.

    ``check_files``: also require the model source (:func:`resolve_model_source`) and prompt
    files to exist (turn off for planning from a recipe whose weights live elsewhere).
    Raises :class:`RecipeError` for a missing file, a YAML syntax error or duplicate key (with
    its line), and every schema problem.
    """
    path = Path(path)
    origin = str(path)
    if not path.is_file():
        raise RecipeError(origin, [RecipeProblem(
            "", NO_VALUE, "an existing recipe file",
            f"check the path; shipped recipes are in {RECIPES_DIR} "
            f"(e.g. {DEFAULT_RECIPE_NAME}.yaml)")])
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise RecipeError(origin, [_yaml_problem(exc)]) from None
    except UnicodeDecodeError as exc:
        raise RecipeError(origin, [RecipeProblem(
            "", NO_VALUE, f"a UTF-8 text (YAML) file; byte {exc.start} is not valid UTF-8",
            "pass the recipe's .yaml file, saved as UTF-8")]) from None
    return parse_recipe(data, origin=origin, base_dir=path.parent.resolve(),
                        check_files=check_files)


def shipped_recipe_names() -> list[str]:
    """Names (file stems) of the recipes shipped in ``recipes/``."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    """A recipe file from a path, or from a shipped recipe name (``smollm2-135m-cpu``).
    Raises :class:`RecipeError` with a did-you-mean when neither exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = shipped_recipe_names()
    close = difflib.get_close_matches(str(name_or_path), names, n=1)
    fix = f"did you mean '{close[0]}'?" if close else f"use a path or one of {names}"
    raise RecipeError(str(name_or_path), [RecipeProblem("", NO_VALUE, "a recipe file or the "
                                                        "name of a shipped recipe", fix)])


def recipe_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the recipe's canonical JSON (all fields, defaults included, sorted keys).

    Stable across key order, comments and spelling out a default; changes with any setting.
    Where the file lives is not part of it.
    """
    canon = json.dumps(recipe.model_dump(mode="json", by_alias=True), sort_keys=True,
                       separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()
