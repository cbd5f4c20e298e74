"""The recipe's ``runtime`` section: how the runtime serves an artifact (scheduler policy and
budgets, prefix caching, speculative decoding). Nothing here changes a byte that ``trtpipe build``
writes, so the section is not part of the build hash (:mod:`~trtpipe.pipeline.recipe.hashing`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtpipe.pipeline.recipe.base import Spec
from trtpipe.runtime.speculative.config import SpeculativeConfig


class SchedulerSpec(Spec):
    """How the runtime divides each step between prefill and decode (``runtime.scheduler``).

    ``policy``: ``slo`` sizes each step's prefill chunk from the engine's measured step-cost
    model so the step stays within the TPOT budget (Sarathi-Serve's token budget, never below
    one block); ``fcfs`` prefills up to ``max_num_tokens`` per step. ``tpot_budget_ms``: the
    budget ``slo`` keeps; None = each validate scenario's tightest ``tpot_ms`` budget, else its
    ``itl_ms`` budget. Without any of these budgets, ``trtpipe serve`` (and validate, for a scenario
    without one) runs the TPOT and ITL budgets it derives from the engine's measured step-cost model
    (:mod:`trtpipe.runtime.sched.serving_budgets`: TPOT 50 ms and ITL 100 ms where the engine
    holds them, raised just enough where it cannot).
    ``itl_budget_ms``: the longest token gap accepted; with it ``slo`` may plan steps up to 0.8x
    this budget while every decoding request's TPOT stays within ``tpot_budget_ms`` (bigger
    chunks, shorter TTFT); None = each validate scenario's tightest ``itl_ms`` budget, else
    every step within the TPOT budget. An ITL budget without a TPOT budget is also the TPOT budget.
    ``itl_during_prefill_ratio``: a step that carries prompt chunks beside decodes takes at most
    this many times the predicted decode-only step, chunks down to one token (a decoding stream
    keeps its pace while others prefill; their TTFT grows); None = each validate scenario's
    ``itl_during_prefill_ratio`` budget, else none (the budgets alone set the chunk).
    """

    policy: Literal["slo", "fcfs"] = "slo"
    tpot_budget_ms: float | None = Field(None, gt=0, allow_inf_nan=False, examples=[50])
    itl_budget_ms: float | None = Field(None, gt=0, allow_inf_nan=False, examples=[100])
    itl_during_prefill_ratio: float | None = Field(None, gt=1, allow_inf_nan=False, examples=[1.5])


class SpeculativeSpec(Spec):
    """Speculative decoding without a draft model (``runtime.speculative``; absent = off):
    ``method: ngram`` proposes the continuation of the longest earlier n-gram (``min_n`` ..
    ``max_n`` tokens) of the request's own context, and the runtime verifies up to ``max_k`` of
    them per step in one prefill-path chunk, k sized from the verify cost it measures at load
    (runtime/speculative/). Greedy outputs are those of plain decoding on the native engine (on ONNX Runtime
    they may differ at near-ties); sampling keeps its distribution."""

    method: Literal["ngram"] = "ngram"
    max_k: int = Field(4, ge=1, le=16)
    min_n: int = Field(2, ge=1, le=16)
    max_n: int = Field(4, ge=1, le=16)

    @model_validator(mode="after")
    def _n_range(self) -> SpeculativeSpec:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n = {self.min_n} > max_n = {self.max_n}: expected min_n <= max_n; fix: lower min_n")
        return self


class RuntimeSpec(Spec):
    """How the runtime serves the artifact: settings that change no byte of what ``trtpipe build``
    writes, so they are not part of :func:`build_hash` and changing them needs no rebuild
    (``trtpipe serve`` and ``validate`` read them; serve's flags override them).

    ``prefix_caching``: reuse the KV blocks of identical prompt prefixes across requests
    (automatic prefix caching, vLLM v1's scheme; outputs are unchanged). ``scheduler``: see
    :class:`SchedulerSpec`. ``speculative``: see :class:`SpeculativeSpec` (None = off).
    """

    prefix_caching: bool = True
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    speculative: SpeculativeSpec | None = None

    def spec_config(self) -> SpeculativeConfig | None:
        """The runtime's :class:`~trtpipe.runtime.speculative.config.SpeculativeConfig` of ``speculative``."""
        return None if self.speculative is None else SpeculativeConfig(**self.speculative.model_dump())
