"""The validate section of a recipe: scenarios (prompt and output lengths, arrivals, budgets) and
the correctness gate. Budgets leave the recipe as the runtime's own records
(:meth:`Budgets.runtime_budgets` -> :class:`trtpipe.runtime.measure.budgets.Budget`), validated here once."""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, model_validator

from trtpipe.pipeline.recipe.base import Name, Spec
from trtpipe.pipeline.recipe.errors import MISSING, Issue, RecipeError, RecipeProblem, fail
from trtpipe.runtime.measure.budgets import LATENCY_BUDGET_METRICS, Budget


class UniformTokens(Spec):
    """Lengths drawn uniformly from ``[min, max]`` tokens (both inclusive)."""

    min: int = Field(ge=1, examples=[32])
    max: int = Field(ge=1, examples=[128])

    @model_validator(mode="after")
    def _ordered(self) -> UniformTokens:
        if self.min > self.max:
            raise fail(Issue(("min",), self.min, f"min <= max ({self.max})", "swap min and max"))
        return self


def _int_shorthand(value: Any) -> Any:
    # `prompt_tokens: 128` means `prompt_tokens: {fixed: 128}`.
    if isinstance(value, int) and not isinstance(value, bool):
        return {"fixed": value}
    return value


class _Lengths(Spec):
    """Token lengths given in one of ``FORMS``; a bare integer ``n`` means ``{fixed: n}``."""

    FORMS: ClassVar[tuple[str, ...]]
    EXAMPLE: ClassVar[str]  # the fix shown when not exactly one form is given

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _int_shorthand(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> _Lengths:
        given = [k for k in self.FORMS if getattr(self, k) is not None]
        if len(given) != 1:
            forms = ", ".join(self.FORMS[:-1]) + " or " + self.FORMS[-1]
            raise fail(
                Issue((), {k: getattr(self, k) for k in given} or MISSING, f"exactly one of {forms}", self.EXAMPLE)
            )
        return self


class OutputTokens(_Lengths):
    """Output lengths in tokens: ``fixed: n`` (or just ``n``) or ``uniform: {min, max}``.
    Generation is forced to that length (EOS ignored) so runs are comparable."""

    FORMS = ("fixed", "uniform")
    EXAMPLE = "write e.g. `output_tokens: 64` or `output_tokens: {uniform: {min: 16, max: 64}}`"

    fixed: int | None = Field(None, ge=1, examples=[64])
    uniform: UniformTokens | None = None

    @property
    def max_tokens(self) -> int:
        """The largest length this spec can produce."""
        if self.fixed is not None:
            return self.fixed
        assert self.uniform is not None  # _exactly_one
        return self.uniform.max


class PromptTokens(_Lengths):
    """Prompt lengths in tokens: ``fixed: n`` (or just ``n``), ``uniform: {min, max}``, or
    ``file``: a prompt file (path resolved against the recipe's folder, then the CWD) whose
    prompts are used as written."""

    FORMS = ("fixed", "uniform", "file")
    EXAMPLE = "write e.g. `prompt_tokens: 128` or `prompt_tokens: {uniform: {min: 32, max: 128}}`"

    fixed: int | None = Field(None, ge=1, examples=[128])
    uniform: UniformTokens | None = None
    file: str | None = None

    @property
    def max_tokens(self) -> int | None:
        """The longest prompt this spec can produce; None for a prompt file (known after
        tokenization)."""
        if self.fixed is not None:
            return self.fixed
        return self.uniform.max if self.uniform is not None else None


Percentile = Literal["p50", "p90", "p95", "p99"]


class PercentileBudget(Spec):
    """Upper limits on a latency percentile (same unit as the metric, ms). At least one."""

    p50: float | None = Field(None, gt=0, examples=[100])
    p90: float | None = Field(None, gt=0, examples=[100])
    p95: float | None = Field(None, gt=0, examples=[100])
    p99: float | None = Field(None, gt=0, examples=[100])

    @model_validator(mode="after")
    def _at_least_one(self) -> PercentileBudget:
        if all(getattr(self, p) is None for p in get_args(Percentile)):
            raise fail(
                Issue((), MISSING, "at least one of p50, p90, p95, p99", "add e.g. `p95: 500`, or remove this metric")
            )
        return self

    def items(self) -> list[tuple[str, float]]:
        """``[(percentile, limit)]`` for the percentiles that are set, in p50..p99 order."""
        return [(p, v) for p in get_args(Percentile) if (v := getattr(self, p)) is not None]


class Budgets(Spec):
    """Latency budgets of a scenario (see DESIGN.md "Metrics" for the definitions):
    ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` over requests, ``itl_ms`` over tokens, each with
    percentile limits; ``min_output_tokens_per_s``: lower limit on output throughput (output
    tokens of measured requests / wall time of the measured phase). Engine gates, measured by
    probes after the workload: ``cancel_ms`` (percentiles of cancel -> KV blocks freed, at
    saturation) and ``itl_during_prefill_ratio`` (a decoding request's ITL p95 while another request
    prefills, over its steady ITL p95)."""

    ttft_ms: PercentileBudget | None = None
    tpot_ms: PercentileBudget | None = None
    itl_ms: PercentileBudget | None = None
    e2e_ms: PercentileBudget | None = None
    min_output_tokens_per_s: float | None = Field(None, gt=0, examples=[100])
    # engine-level gates, measured by probes after the scenario's workload
    # (runtime/measure/engine_probes.py), not by the workload itself
    cancel_ms: PercentileBudget | None = None
    # > 1: a step that prefills beside a decode always takes longer than the decode alone; under
    # the slo policy validate also keeps it as the scheduler's setting (runtime.scheduler's field)
    itl_during_prefill_ratio: float | None = Field(None, gt=1, allow_inf_nan=False, examples=[1.5])

    def engine_budgets(self) -> tuple[Budget, ...]:
        """The probe budgets as runtime records: ``Budget("cancel_ms", "p95", "max", 500.0)`` (a
        cancelled request's KV freed within, at saturation) and ``Budget("itl_during_prefill_ratio",
        "p95", "max", 1.5)`` (a decoding request's ITL p95 while another prefills / its steady ITL p95)."""
        out = [Budget("cancel_ms", p, "max", float(v)) for p, v in (self.cancel_ms.items() if self.cancel_ms else [])]
        if self.itl_during_prefill_ratio is not None:
            out.append(Budget("itl_during_prefill_ratio", "p95", "max", float(self.itl_during_prefill_ratio)))
        return tuple(out)

    def limits(self) -> list[tuple[str, str, float]]:
        """Latency limits as ``[(metric, percentile, limit_ms)]``, e.g.
        ``("ttft_ms", "p95", 1500.0)``; the throughput floor is not included."""
        out: list[tuple[str, str, float]] = []
        for metric in LATENCY_BUDGET_METRICS:
            spec = getattr(self, metric)
            if spec is not None:
                out.extend((metric, p, v) for p, v in spec.items())
        return out

    def runtime_budgets(self) -> tuple[Budget, ...]:
        """The budgets as the runtime's records, validated here once (the runtime does not parse
        them again): ``Budget("ttft_ms", "p95", "max", 1500.0)`` per latency limit (ms), then
        ``Budget("output_tokens_per_s", None, "min", x)`` for the throughput floor (tokens/s)."""
        out = [Budget(metric=m, percentile=p, kind="max", limit=float(v)) for m, p, v in self.limits()]
        if self.min_output_tokens_per_s is not None:
            out.append(
                Budget(
                    metric="output_tokens_per_s", percentile=None, kind="min", limit=float(self.min_output_tokens_per_s)
                )
            )
        return tuple(out)


class Scenario(Spec):
    """One validate workload: ``num_requests`` measured requests after ``num_warmup_requests``
    excluded ones, with prompt and output lengths drawn with ``seed``, arriving either in a
    closed loop of ``concurrency`` clients or as a Poisson process of ``arrival_rate_per_s``
    (exactly one of the two).

    ``system_prompt_tokens``: every prompt starts with the same system prompt of this many corpus
    tokens (a shared prefix: what prefix caching saves); the drawn ``prompt_tokens`` are then the
    user turn. ``chat``: wrap system prompt and user turn in the model's chat template."""

    name: Name = Field(examples=["chat"])
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

    @model_validator(mode="after")
    def _arrivals(self) -> Scenario:
        if (self.concurrency is None) == (self.arrival_rate_per_s is None):
            both = self.concurrency is not None
            raise fail(
                Issue(
                    ("concurrency",),
                    self.concurrency if both else MISSING,
                    "exactly one of concurrency (closed loop) or arrival_rate_per_s (Poisson arrivals)",
                    "remove one of them" if both else "add e.g. `concurrency: 4`",
                )
            )
        return self


class CorrectnessSpec(Spec):
    """Correctness gate of validate: the fp32 reference's greedy continuations of the golden
    prompts (``num_sequences`` of them, None = all; ``num_tokens`` tokens each) teacher-forced
    through the artifact's engines. It passes when (1) the fraction of positions whose argmax
    agrees is at least ``int4_teacher_forced_agreement_min``, (2) the first generated token of
    every golden prompt equals the reference's (it decides the whole answer), and (3) no position
    disagrees where the reference's own top-2 margin is ``tie_threshold_logits`` or more: a flip
    there is an error of the engine, not a near-tie that any rounding may turn (measured on
    SmolLM2: every disagreement of the exact-weight INT4 artifacts was below 0.25 logits).
    ``plugin_free_teacher_forced_agreement_min``: the agreement gate for the plugin-free variant
    whose asymmetric INT4 weights were changed for TensorRT (``engine.plugin_free_int4``:
    re-quantized or dequantized), applied when the build measures it (on the CPU, against the
    fp32 reference) and by validate on an artifact of that variant (which is held to (1) only).
    ``golden_set``: the golden prompts (``default`` or ``base``, see the field)."""

    int4_teacher_forced_agreement_min: float = Field(0.98, gt=0, le=1, examples=[0.98])
    plugin_free_teacher_forced_agreement_min: float | None = Field(None, gt=0, le=1, examples=[0.9])
    tie_threshold_logits: float = Field(0.25, gt=0, allow_inf_nan=False, examples=[0.25])
    num_sequences: int | None = Field(None, ge=1, examples=[18])
    num_tokens: int = Field(64, ge=1, examples=[64])
    # which golden prompts (pipeline/stages/golden/prompts.py): "default" (chat-templated questions
    # and raw completions), "base" (raw completions only, prompts past a 512-token window and of
    # 511/512/513 tokens: for pretrained models without a chat template)
    golden_set: Literal["default", "base"] = Field("default", examples=["base"])


class ValidateSpec(Spec):
    """What ``trtpipe validate`` runs: scenarios (unique names) and the correctness gate."""

    scenarios: tuple[Scenario, ...] = Field((), strict=False)
    correctness: CorrectnessSpec | None = None

    @model_validator(mode="after")
    def _unique(self) -> ValidateSpec:
        seen: set[str] = set()
        for i, s in enumerate(self.scenarios):
            if s.name in seen:
                raise fail(
                    Issue(
                        ("scenarios", i, "name"),
                        s.name,
                        "a name not used by an earlier scenario",
                        "rename this scenario",
                    )
                )
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
        problem = RecipeProblem("validate.scenarios", name, "the name of a scenario of this recipe", hint)
        raise RecipeError("<recipe>", [problem])
