"""Synthetic serving workloads for ``trtpipe validate``: make the requests, run them, time them.

A scenario of the recipe becomes a :class:`WorkloadSpec` (plain data, no recipe import: the
pipeline converts), then a list of :class:`WorkItem` records with :func:`make_workload`::

    WorkItem(arrival_s=0.73, prompt_ids=(504, 3575, ...), max_new_tokens=32, warmup=False)

- **Prompts** are real English text, not random ids (random ids make attention and the
  tokenizer-dependent paths behave unlike real traffic): a prompt of N tokens is N consecutive
  tokens of the built-in :data:`CORPUS` starting at a seeded offset, read cyclically; or the
  lines of a prompt file, used in order (cycling), tokenized as written.
- **Output lengths** are forced: ``SamplingParams(max_new_tokens=n, ignore_eos=True)``, greedy,
  so every run of a scenario produces the same number of tokens and runs are comparable.
- **Arrivals** are either a Poisson process (exponential gaps with mean ``1 / rate`` seconds,
  the first request at 0) -- an *open loop*: requests arrive whether or not the server keeps up,
  so queueing shows in TTFT -- or a *closed loop* of ``concurrency`` clients, each sending its
  next request when the previous one finished (arrival = that moment).
- **Warm-up** requests (``warmup=True``) run to completion first and are not measured.

Each random quantity (prompt lengths, prompt offsets, output lengths, arrival gaps, and the same
for warm-up) has its own child stream of ``numpy.random.SeedSequence(seed)``, so changing the
number of warm-up requests does not change the measured requests.

:func:`run_workload` drives an :class:`~trtpipe.runtime.llm.LLM` (or anything with the same
``add_request`` / ``step`` / ``has_unfinished`` / ``block_pool`` / ``step_stats`` surface) and
returns every measured request's :class:`RequestMetrics`, the wall time and the step statistics,
including the KV leak check (every block free after the run) and the peak resident memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.measure.workload_corpus import CORPUS, Encoder, corpus_token_ids
from trtpipe.runtime.metrics.request_metrics import RequestMetrics, StepStats
from trtpipe.runtime.sample.params import SamplingParams

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM


class WorkloadError(TrtpipeError, ValueError):
    """A workload spec that cannot produce requests (empty prompt file, bad lengths, ...)."""


# ---------------------------------------------------------------------------------------------
# Spec and items
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """One scenario in runtime terms (the pipeline builds it from the recipe's scenario).

    Lengths are ``(min, max)`` token counts, both inclusive (fixed n = ``(n, n)``). Exactly one
    of ``prompt_tokens`` (corpus slices) and ``prompts`` (texts of a prompt file) is set, and
    exactly one of ``concurrency`` (closed loop) and ``arrival_rate_per_s`` (Poisson, open loop).
    """

    name: str
    num_requests: int
    num_warmup_requests: int
    output_tokens: tuple[int, int]
    prompt_tokens: tuple[int, int] | None = None
    prompts: tuple[str, ...] | None = None
    concurrency: int | None = None
    arrival_rate_per_s: float | None = None
    seed: int = 0
    system_prompt_tokens: int = 0  # a fixed system prompt (corpus tokens) shared by every prompt
    chat: bool = False  # wrap system prompt + user turn in the model's chat template

    def check(self) -> WorkloadSpec:
        """Raise :class:`WorkloadError` naming the field when the spec cannot make requests."""
        bad = []
        if self.num_requests < 1:
            bad.append(f"num_requests={self.num_requests}: expected >= 1")
        if self.num_warmup_requests < 0:
            bad.append(f"num_warmup_requests={self.num_warmup_requests}: expected >= 0")
        for field_name in ("output_tokens", "prompt_tokens"):
            rng = getattr(self, field_name)
            if rng is not None and not (1 <= rng[0] <= rng[1]):
                bad.append(f"{field_name}={rng}: expected (min, max) with 1 <= min <= max")
        if (self.prompt_tokens is None) == (self.prompts is None):
            bad.append("exactly one of prompt_tokens (lengths) or prompts (a prompt file) is needed")
        if self.prompts is not None and not any(p.strip() for p in self.prompts):
            bad.append("prompts: the prompt file has no non-empty line")
        if (self.concurrency is None) == (self.arrival_rate_per_s is None):
            bad.append("exactly one of concurrency or arrival_rate_per_s is needed")
        if self.concurrency is not None and self.concurrency < 1:
            bad.append(f"concurrency={self.concurrency}: expected >= 1")
        if self.system_prompt_tokens < 0:
            bad.append(f"system_prompt_tokens={self.system_prompt_tokens}: expected >= 0")
        if self.arrival_rate_per_s is not None and not self.arrival_rate_per_s > 0:
            bad.append(f"arrival_rate_per_s={self.arrival_rate_per_s}: expected > 0")
        if bad:
            raise WorkloadError(
                f"workload {self.name!r}: "
                + "; ".join(bad)
                + ". Fix: correct the scenario in the recipe's validate section."
            )
        return self


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload.

    ``arrival_s``: scheduled arrival in seconds after the start of the measured phase (Poisson
    workloads; 0.0 in a closed loop, where a request arrives when a client slot frees up).
    ``prompt_ids``: [prompt tokens] int token ids. ``max_new_tokens``: the forced output length.
    ``cache_salt``: the request's prefix-cache salt (None: the common cache); the goodput search
    gives each probe its own, so a probe never hits the blocks of the same prompts in an earlier one.
    """

    arrival_s: float
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    warmup: bool = False
    cache_salt: str | None = None

    def sampling_params(self) -> SamplingParams:
        """Greedy, EOS ignored: the output is exactly ``max_new_tokens`` tokens."""
        return SamplingParams(max_new_tokens=self.max_new_tokens, ignore_eos=True)


def _draw_lengths(rng: np.random.Generator, lo_hi: tuple[int, int], n: int) -> list[int]:
    lo, hi = lo_hi
    return [int(x) for x in rng.integers(lo, hi + 1, size=n)]


def _corpus_slice(corpus: Sequence[int], offset: int, n: int) -> tuple[int, ...]:
    """``n`` consecutive ids from ``offset``, wrapping to the start (a prompt may exceed it)."""
    m = len(corpus)
    return tuple(corpus[(offset + i) % m] for i in range(n))


def check_chat_template(spec: WorkloadSpec, chat_template: str | None) -> None:
    """Raise :class:`WorkloadError` when ``spec.chat`` and the model has no ``chat_template``."""
    if spec.chat and not chat_template:
        raise WorkloadError(
            f"workload {spec.name!r}: chat: true but the model has no chat template (a pretrained base model "
            "continues raw text). Fix: set chat: false in the scenario (or remove the key)."
        )


def _with_system_prompt(
    spec: WorkloadSpec,
    tokenizer: Encoder,
    corpus: list[int] | None,
    users: list[tuple[int, ...]],
    chat_template: str | None,
) -> list[tuple[int, ...]]:
    """Prefix every user turn with the scenario's fixed system prompt (the first
    ``system_prompt_tokens`` corpus tokens), in the chat template when ``spec.chat``."""
    system = _corpus_slice(corpus, 0, spec.system_prompt_tokens) if spec.system_prompt_tokens and corpus else ()
    if not spec.chat:
        return [system + u for u in users]
    check_chat_template(spec, chat_template)
    assert chat_template is not None  # checked just above (narrows the type for mypy)
    from trtpipe.runtime.artifact.chat_template import render_chat

    system_text = tokenizer.decode(system) if system else None
    out = []
    for u in users:
        messages = [{"role": "system", "content": system_text}] if system_text else []
        messages.append({"role": "user", "content": tokenizer.decode(u)})
        out.append(tuple(tokenizer.encode(render_chat(chat_template, messages), add_special_tokens=True)))
    return out


def _make_items(
    spec: WorkloadSpec,
    tokenizer: Encoder,
    corpus: list[int] | None,
    seeds: Sequence[np.random.SeedSequence],
    n: int,
    warmup: bool,
    chat_template: str | None = None,
) -> list[WorkItem]:
    """``n`` items from four child seed streams: prompt lengths, offsets, outputs, arrivals."""
    if n == 0:
        return []
    rng_plen, rng_off, rng_out, rng_arr = (np.random.default_rng(s) for s in seeds)
    outs = _draw_lengths(rng_out, spec.output_tokens, n)
    if spec.prompts is not None:
        lines = [p for p in spec.prompts if p.strip()]
        # Warm-up starts elsewhere in the file so it does not pre-run the measured prompts' path.
        start = int(rng_off.integers(0, len(lines)))
        prompts = [tuple(tokenizer.encode(lines[(start + i) % len(lines)], add_special_tokens=True)) for i in range(n)]
        if any(not p for p in prompts):
            raise WorkloadError(
                f"workload {spec.name!r}: a prompt of the prompt file tokenizes to "
                "no tokens. Fix: remove blank or whitespace-only prompts."
            )
    else:
        assert corpus is not None and spec.prompt_tokens is not None
        lens = _draw_lengths(rng_plen, spec.prompt_tokens, n)
        offsets = [int(x) for x in rng_off.integers(0, len(corpus), size=n)]
        prompts = [_corpus_slice(corpus, o, k) for o, k in zip(offsets, lens)]
    if spec.system_prompt_tokens or spec.chat:
        prompts = _with_system_prompt(spec, tokenizer, corpus, prompts, chat_template)
    if spec.arrival_rate_per_s is not None and not warmup:
        gaps = rng_arr.exponential(1.0 / spec.arrival_rate_per_s, size=n)
        gaps[0] = 0.0  # the first request opens the measured phase
        arrivals = [float(x) for x in np.cumsum(gaps)]
    else:
        arrivals = [0.0] * n
    return [WorkItem(a, p, o, warmup) for a, p, o in zip(arrivals, prompts, outs)]


def make_workload(spec: WorkloadSpec, tokenizer: Encoder, chat_template: str | None = None) -> list[WorkItem]:
    """The requests of ``spec``: warm-up items first (``warmup=True``), then the measured ones.

    ``chat_template``: the model's template, needed by a ``chat`` spec.

    Deterministic for a given spec and tokenizer. Raises :class:`WorkloadError` for a bad spec.
    """
    spec.check()
    corpus = corpus_token_ids(tokenizer) if spec.prompts is None or spec.system_prompt_tokens else None
    if corpus is not None and not corpus:
        raise WorkloadError("the built-in corpus tokenized to no tokens; the tokenizer is broken")
    measured_seeds, warmup_seeds = np.random.SeedSequence(spec.seed).spawn(2)
    return _make_items(
        spec, tokenizer, corpus, warmup_seeds.spawn(4), spec.num_warmup_requests, True, chat_template
    ) + _make_items(spec, tokenizer, corpus, measured_seeds.spawn(4), spec.num_requests, False, chat_template)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def _run_warmup(llm: LLM, items: Sequence[WorkItem], concurrency: int | None) -> None:
    """Run the warm-up requests to completion (at most ``concurrency`` at once; default all)."""
    pending = deque(items)
    in_flight = 0
    limit = concurrency or len(items)
    while pending or llm.has_unfinished():
        while pending and in_flight < limit:
            it = pending.popleft()
            llm.add_request(list(it.prompt_ids), it.sampling_params(), cache_salt=it.cache_salt)
            in_flight += 1
        in_flight -= len(llm.step())


def run_workload(
    llm: LLM,
    items: Sequence[WorkItem],
    concurrency: int | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_request_done: Callable[[int, int], None] | None = None,
) -> tuple[list[RequestMetrics], float, StepStats]:
    """Run a workload on ``llm``; return (measured requests' metrics, wall seconds, step stats).

    Warm-up items run first, to completion, and are excluded. Then the measured phase starts at
    ``t0 = clock()``:

    - ``concurrency=None`` (open loop): item i is added at ``t0 + arrival_s`` and its *scheduled*
      arrival is what ``add_request(arrival_s=...)`` gets, so TTFT includes the time it waited
      because the engine was busy (a late add is queueing too). When nothing is running and the
      next arrival is in the future, ``sleep`` until it.
    - ``concurrency=C`` (closed loop): keep C requests in flight; a request arrives when it is
      added (at the start, or when an earlier one finishes).

    ``clock`` must be the clock the LLM timestamps tokens with (``time.monotonic`` for
    :class:`LLM`; tests pass a fake LLM and a fake clock). The LLM's ``step_stats`` is replaced
    by a fresh :class:`StepStats` for the measured phase (and restored afterwards), which gets
    the leak check (``on_run_end(llm.block_pool.num_used)``: 0 means every KV block was freed)
    and the process's peak RSS. ``wall_s`` runs from ``t0`` to the end of the last step, so
    output tokens/s = output tokens / ``wall_s``. Results are in the order of ``items``.
    ``on_request_done(done, total)`` is called as measured requests finish (progress display).
    """
    warm = [it for it in items if it.warmup]
    measured = [it for it in items if not it.warmup]
    if concurrency is not None and concurrency < 1:
        raise WorkloadError(f"concurrency={concurrency}: expected >= 1 or None (open loop)")
    if warm:
        _run_warmup(llm, warm, concurrency)

    previous_stats = llm.step_stats
    stats = StepStats(num_kv_blocks=previous_stats.num_kv_blocks)
    llm.step_stats = stats
    try:
        order, results, wall_s = _run_measured(llm, measured, concurrency, clock, sleep, on_request_done)
    finally:
        llm.step_stats = previous_stats
    stats.on_run_end(llm.block_pool.num_used)
    stats.on_rss()
    missing = [rid for rid in order if rid not in results]
    assert not missing, f"requests {missing} never finished"  # the loop runs until none is left
    by_index = sorted(order.items(), key=lambda kv: kv[1])
    return [results[rid] for rid, _ in by_index], wall_s, stats


def _run_measured(
    llm: LLM,
    measured: Sequence[WorkItem],
    concurrency: int | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    on_request_done: Callable[[int, int], None] | None,
) -> tuple[dict[str, int], dict[str, RequestMetrics], float]:
    """The measured phase of :func:`run_workload` (open or closed loop, see there). Returns
    (request id -> item index, request id -> metrics of the finished ones, wall seconds)."""
    order: dict[str, int] = {}
    results: dict[str, RequestMetrics] = {}
    # Open loop: by scheduled arrival (a stable sort keeps item order for ties).
    pending = deque(
        sorted(range(len(measured)), key=lambda i: measured[i].arrival_s)
        if concurrency is None
        else range(len(measured))
    )
    t0 = clock()

    def submit(i: int, arrival: float) -> None:
        it = measured[i]
        rid = llm.add_request(list(it.prompt_ids), it.sampling_params(), arrival_s=arrival, cache_salt=it.cache_salt)
        order[rid] = i

    while pending or llm.has_unfinished():
        if concurrency is None:
            now = clock()
            while pending and t0 + measured[pending[0]].arrival_s <= now:
                i = pending.popleft()
                submit(i, t0 + measured[i].arrival_s)
            if not llm.has_unfinished():
                if pending:  # idle until the next arrival
                    sleep(max(0.0, t0 + measured[pending[0]].arrival_s - now))
                continue
        else:
            while pending and len(order) - len(results) < concurrency:
                submit(pending.popleft(), clock())
        for out in llm.step():
            if out.request_id in order and out.metrics is not None:
                results[out.request_id] = out.metrics
                if on_request_done is not None:
                    on_request_done(len(results), len(measured))
    return order, results, clock() - t0


__all__ = [
    "CORPUS",
    "WorkItem",
    "WorkloadError",
    "WorkloadSpec",
    "check_chat_template",
    "corpus_token_ids",
    "make_workload",
    "run_workload",
]
