"""Workload generation (seeded, exact lengths, real-text prompts, arrivals) and run_workload with
a fake LLM on a fake clock: TTFT from the scheduled arrival (queueing included), sleeping until
the next arrival, closed-loop concurrency, warm-up exclusion, leak check."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from trtpipe.runtime.measure.workload import (
    CORPUS,
    WorkItem,
    WorkloadError,
    WorkloadSpec,
    corpus_token_ids,
    make_workload,
    run_workload,
)
from trtpipe.runtime.metrics.request_metrics import RequestTimer, StepStats


class WordTokenizer:
    """One id per whitespace-separated word: id = position of the word's first use (1-based)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.calls: list[tuple[str, bool]] = []

    def encode(self, text, add_special_tokens=True):
        self.calls.append((text, add_special_tokens))
        ids = [self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.split()]
        return ([0] if add_special_tokens else []) + ids  # 0 = a "BOS" the file prompts get


def spec(**kw) -> WorkloadSpec:
    base = dict(
        name="t",
        num_requests=20,
        num_warmup_requests=2,
        output_tokens=(4, 4),
        prompt_tokens=(8, 8),
        arrival_rate_per_s=2.0,
        seed=7,
    )
    base.update(kw)
    return WorkloadSpec(**base)


def is_cyclic_slice(corpus, ids) -> bool:
    m = len(corpus)
    return any(all(corpus[(o + i) % m] == t for i, t in enumerate(ids)) for o in range(m))


# ---------------------------------------------------------------------------------------------
# make_workload
# ---------------------------------------------------------------------------------------------


def test_seeded_and_deterministic():
    a = make_workload(spec(), WordTokenizer())
    b = make_workload(spec(), WordTokenizer())
    c = make_workload(spec(seed=8), WordTokenizer())
    assert a == b
    assert a != c


def test_warmup_first_and_counted():
    items = make_workload(spec(num_requests=5, num_warmup_requests=3), WordTokenizer())
    assert [it.warmup for it in items] == [True] * 3 + [False] * 5
    assert all(it.arrival_s == 0.0 for it in items[:3])  # warm-up is not paced


def test_warmup_count_does_not_change_measured_requests():
    a = [it for it in make_workload(spec(num_warmup_requests=0), WordTokenizer()) if not it.warmup]
    b = [it for it in make_workload(spec(num_warmup_requests=5), WordTokenizer()) if not it.warmup]
    assert a == b


def test_fixed_lengths_exact():
    items = make_workload(spec(prompt_tokens=(37, 37), output_tokens=(11, 11)), WordTokenizer())
    assert {len(it.prompt_ids) for it in items} == {37}
    assert {it.max_new_tokens for it in items} == {11}


def test_uniform_lengths_inclusive_bounds():
    items = make_workload(spec(num_requests=400, prompt_tokens=(5, 9), output_tokens=(2, 4)), WordTokenizer())
    assert {len(it.prompt_ids) for it in items} == {5, 6, 7, 8, 9}
    assert {it.max_new_tokens for it in items} == {2, 3, 4}


def test_prompts_are_consecutive_corpus_tokens_and_wrap():
    tok = WordTokenizer()
    corpus = corpus_token_ids(tok)
    assert len(corpus) == len(CORPUS.split())
    items = make_workload(spec(num_requests=10, prompt_tokens=(20, 40)), tok)
    for it in items:
        assert is_cyclic_slice(corpus, it.prompt_ids)
    # Longer than the whole corpus: read cyclically, still real text.
    long = make_workload(spec(num_requests=1, num_warmup_requests=0, prompt_tokens=(len(corpus) + 5,) * 2), tok)[0]
    assert len(long.prompt_ids) == len(corpus) + 5
    assert is_cyclic_slice(corpus, long.prompt_ids)


def test_prompt_file_lines_in_order_with_special_tokens():
    tok = WordTokenizer()
    lines = ("alpha beta", "  ", "gamma", "delta epsilon zeta")
    items = make_workload(spec(prompt_tokens=None, prompts=lines, num_requests=5, num_warmup_requests=0), tok)
    texts = [c for c in tok.calls if c[1]]
    assert all(add for _, add in texts)  # prompts are tokenized as the model asks (BOS etc.)
    non_blank = ["alpha beta", "gamma", "delta epsilon zeta"]
    got = [t for t, _ in texts]
    start = non_blank.index(got[0])
    assert got == [non_blank[(start + i) % 3] for i in range(5)]  # in order, cycling
    assert [len(it.prompt_ids) for it in items] == [len(tok.encode(t)) for t in got]


def test_poisson_arrivals_mean_gap():
    items = make_workload(spec(num_requests=4000, num_warmup_requests=0, arrival_rate_per_s=4.0), WordTokenizer())
    arr = np.array([it.arrival_s for it in items])
    assert arr[0] == 0.0
    assert np.all(np.diff(arr) >= 0)
    gaps = np.diff(arr)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)  # 1 / rate
    assert gaps.std() == pytest.approx(0.25, rel=0.08)  # exponential: std == mean


def test_closed_loop_has_no_schedule():
    items = make_workload(spec(arrival_rate_per_s=None, concurrency=3), WordTokenizer())
    assert all(it.arrival_s == 0.0 for it in items)


def test_sampling_params_force_length_greedy():
    p = WorkItem(0.0, (1, 2), 17).sampling_params()
    assert (p.max_new_tokens, p.ignore_eos, p.temperature) == (17, True, 0.0)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(num_requests=0), "num_requests=0"),
        (dict(prompt_tokens=(9, 3)), "prompt_tokens=(9, 3)"),
        (dict(output_tokens=(0, 3)), "output_tokens=(0, 3)"),
        (dict(prompt_tokens=None), "exactly one of prompt_tokens"),
        (dict(prompts=("a",)), "exactly one of prompt_tokens"),
        (dict(prompt_tokens=None, prompts=(" ", "")), "no non-empty line"),
        (dict(concurrency=2), "exactly one of concurrency"),
        (dict(arrival_rate_per_s=None), "exactly one of concurrency"),
    ],
)
def test_bad_spec_names_the_field(kw, needle):
    with pytest.raises(WorkloadError, match="workload 't'") as e:
        make_workload(spec(**kw), WordTokenizer())
    assert needle in str(e.value)


# ---------------------------------------------------------------------------------------------
# run_workload with a fake LLM on a fake clock
# ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.sleeps.append(round(dt, 9))
        self.t += dt


@dataclass
class _Req:
    rid: str
    timer: RequestTimer
    max_new: int
    n_out: int = 0
    admitted: bool = False


@dataclass
class FakeLLM:
    """FCFS engine: each step takes ``step_s``; admits waiting requests while fewer than
    ``max_running`` run; every running request gets one token at the end of the step (a newly
    admitted one: its prefill is that step). One KV block per running request."""

    clock: FakeClock
    step_s: float = 0.1
    max_running: int = 8
    leak_blocks: int = 0
    step_stats: StepStats = field(default_factory=lambda: StepStats(num_kv_blocks=16))
    added: list = field(default_factory=list)  # (rid, arrival, t_added)
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)

    def __post_init__(self):
        self.block_pool = SimpleNamespace(num_used=0)

    def add_request(self, prompt, params, *, arrival_s=None, cache_salt=None):
        rid = f"r{len(self.added)}"
        arrival = self.clock() if arrival_s is None else arrival_s
        self.added.append((rid, arrival, self.clock()))
        self.waiting.append(
            _Req(
                rid,
                RequestTimer(rid, prompt_tokens=len(prompt), arrival_s=arrival, clock=self.clock),
                params.max_new_tokens,
            )
        )
        return rid

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def step(self):
        t0 = self.clock()
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting.pop(0)
            r.timer.on_prefill_start(t0)
            self.running.append(r)
        self.block_pool.num_used = len(self.running)
        self.clock.t += self.step_s
        t1 = self.clock()
        decoding = [r for r in self.running if r.admitted]
        done = []
        for r in self.running:
            if not r.admitted:
                r.timer.on_prefill_end(t1)
                r.admitted = True
            r.timer.on_tokens(t1, 1)
            r.n_out += 1
            if r.n_out == r.max_new:
                r.timer.finish(t1, "length")
                done.append(r)
        self.step_stats.on_step(t1, decode_batch_size=len(decoding), kv_blocks_used=self.block_pool.num_used)
        self.running = [r for r in self.running if r not in done]
        self.block_pool.num_used = len(self.running) + (self.leak_blocks if not self.has_unfinished() else 0)
        return [SimpleNamespace(request_id=r.rid, metrics=r.timer.metrics()) for r in done]


def items(*specs, warmup=0):
    """items((arrival_s, max_new), ...) with 4-token prompts."""
    w = [WorkItem(0.0, (1, 2, 3, 4), 1, warmup=True) for _ in range(warmup)]
    return w + [WorkItem(a, (1, 2, 3, 4), n) for a, n in specs]


def test_ttft_includes_queueing_behind_a_busy_engine():
    clock = FakeClock()
    llm = FakeLLM(clock, max_running=1)
    res, wall, stats = run_workload(llm, items((0.0, 2), (0.0, 2), (0.0, 2)), clock=clock, sleep=clock.sleep)
    # Serial engine: A runs steps 1-2, B steps 3-4, C steps 5-6 (0.1 s each).
    assert [r.ttft_s for r in res] == pytest.approx([0.1, 0.3, 0.5])
    assert [r.queue_s for r in res] == pytest.approx([0.0, 0.2, 0.4])
    assert [r.prefill_s for r in res] == pytest.approx([0.1, 0.1, 0.1])
    assert [r.tpot_s for r in res] == pytest.approx([0.1, 0.1, 0.1])
    assert [r.e2e_s for r in res] == pytest.approx([0.2, 0.4, 0.6])
    assert wall == pytest.approx(0.6)
    assert clock.sleeps == []


def test_arrival_is_the_scheduled_one_even_when_added_late():
    clock = FakeClock()
    llm = FakeLLM(clock, max_running=2)
    t0 = clock.t
    res, _, _ = run_workload(llm, items((0.0, 3), (0.05, 1)), clock=clock, sleep=clock.sleep)
    # B is due at t0+0.05 while A's first step runs (t0..t0+0.1): it is added at t0+0.1 but its
    # arrival is t0+0.05, so its TTFT (first token at t0+0.2) is 0.15 s, not 0.1 s.
    (_, arr_a, _), (_, arr_b, added_b) = llm.added
    assert (arr_a, arr_b) == pytest.approx((t0, t0 + 0.05))
    assert added_b == pytest.approx(t0 + 0.1)
    assert res[1].ttft_s == pytest.approx(0.15)
    assert res[1].queue_s == pytest.approx(0.05)


def test_sleeps_until_next_arrival_when_idle():
    clock = FakeClock()
    llm = FakeLLM(clock)
    res, wall, _ = run_workload(llm, items((0.0, 1), (5.0, 1)), clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [pytest.approx(4.9)]
    assert [r.ttft_s for r in res] == pytest.approx([0.1, 0.1])
    assert wall == pytest.approx(5.1)


def test_open_loop_results_in_item_order_even_if_arrivals_unsorted():
    clock = FakeClock()
    llm = FakeLLM(clock, max_running=1)
    t0 = clock.t
    res, _, _ = run_workload(llm, items((0.3, 1), (0.0, 2)), clock=clock, sleep=clock.sleep)
    assert [a - t0 for _, a, _ in llm.added] == pytest.approx([0.0, 0.3])  # B added first
    assert [r.output_tokens for r in res] == [1, 2]  # but results follow the items
    assert [r.ttft_s for r in res] == pytest.approx([0.1, 0.1])
    assert clock.sleeps == [pytest.approx(0.1)]


def test_closed_loop_keeps_concurrency_in_flight():
    clock = FakeClock()
    llm = FakeLLM(clock, max_running=8)
    t0 = clock.t
    res, wall, stats = run_workload(
        llm, items((0.0, 2), (0.0, 3), (0.0, 2), (0.0, 1)), concurrency=2, clock=clock, sleep=clock.sleep
    )
    arrivals = [a - t0 for _, a, _ in llm.added]
    # A, B at 0; A ends at 0.2 -> C arrives; B ends at 0.3 -> D arrives.
    assert arrivals == pytest.approx([0.0, 0.0, 0.2, 0.3])
    assert [r.ttft_s for r in res] == pytest.approx([0.1, 0.1, 0.1, 0.1])  # never queued
    assert max(stats.decode_batch_sizes) <= 2
    assert wall == pytest.approx(0.4)


def test_warmup_excluded_and_stats_fresh_for_measured_phase():
    clock = FakeClock()
    llm = FakeLLM(clock, max_running=1)
    original = llm.step_stats
    res, wall, stats = run_workload(llm, items((0.0, 2), warmup=3), clock=clock, sleep=clock.sleep)
    assert len(res) == 1 and res[0].ttft_s == pytest.approx(0.1)  # not queued behind warm-up
    assert len(llm.added) == 4
    assert llm.step_stats is original and len(original.step_times_s) == 3  # warm-up steps
    assert len(stats.step_times_s) == 2 and stats.num_kv_blocks == 16
    assert wall == pytest.approx(0.2)


def test_leak_check_and_peak_rss_recorded():
    clock = FakeClock()
    ok = run_workload(FakeLLM(clock), items((0.0, 2)), clock=clock, sleep=clock.sleep)[2]
    assert ok.kv_blocks_in_use_at_end == 0
    assert ok.peak_rss_bytes is not None and ok.peak_rss_bytes > 0
    leaky = run_workload(FakeLLM(clock, leak_blocks=3), items((0.0, 2)), clock=clock, sleep=clock.sleep)[2]
    assert leaky.kv_blocks_in_use_at_end == 3


def test_progress_callback():
    clock = FakeClock()
    seen = []
    run_workload(
        FakeLLM(clock),
        items((0.0, 1), (0.0, 2)),
        clock=clock,
        sleep=clock.sleep,
        on_request_done=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(1, 2), (2, 2)]
