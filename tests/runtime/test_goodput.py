"""Goodput search: on fake engines of known capacity it finds the capacity within its tolerance,
within its probe budget; a fake LLM driven through run_workload (fake clock) has a capacity
computed by hand."""

import math

import pytest

from trtpipe.runtime.measure.goodput import ProbeResult, find_goodput


def _queue_probe(capacity_per_s, base_ms, budget_ms):
    """Latency of an M/M/1-like server: base / (1 - rate/capacity); passes iff <= budget.
    The threshold is capacity * (1 - base/budget), computed by hand."""
    calls = []

    def probe(rate):
        calls.append(rate)
        lat = base_ms / (1 - rate / capacity_per_s) if rate < capacity_per_s else math.inf
        return ProbeResult(rate, lat <= budget_ms, output_tokens_per_s=rate * 32, latency_ms={"ttft_p95": lat})

    return probe, calls


@pytest.mark.parametrize("start", [0.1, 1.0, 7.0, 50.0])
def test_search_finds_the_known_threshold_within_tolerance(start):
    probe, calls = _queue_probe(capacity_per_s=10.0, base_ms=50.0, budget_ms=200.0)
    threshold = 10.0 * (1 - 50 / 200)  # 7.5 req/s
    res = find_goodput("chat", probe, start, rel_tol=0.05, max_probes=20)
    assert res.stopped == "converged"
    assert threshold / 1.05 <= res.goodput_per_s <= threshold
    lo, hi = res.bracket
    assert lo <= threshold < hi and hi / lo <= 1.05
    assert res.output_tokens_per_s == pytest.approx(res.goodput_per_s * 32)
    assert len(calls) == len(res.probes) <= 20


def test_search_is_bounded_and_reports_failure():
    probe, calls = _queue_probe(10.0, 50.0, 200.0)
    res = find_goodput("chat", probe, 1.0, rel_tol=0.001, max_probes=4)
    assert len(calls) == 4 and res.stopped == "max_probes" and res.goodput_per_s <= 7.5
    never = find_goodput("x", lambda r: ProbeResult(r, False), 1.0, min_rate_per_s=0.1)
    assert never.goodput_per_s is None and never.stopped == "min_rate"
    t = iter(range(100))
    timed = find_goodput("x", probe, 1.0, rel_tol=0.001, max_probes=50, time_budget_s=3, clock=lambda: next(t))
    assert timed.stopped == "time_budget" and len(timed.probes) <= 4


def test_goodput_of_a_fake_engine_through_run_workload():
    """A fake LLM that serves one request at a time, 0.1 s each (capacity 10 req/s), under a
    fake clock. Budget: TTFT p95 <= 0.5 s. Poisson arrivals at rate r over 200 requests: the
    queue stays short well below 10 req/s and grows without bound above it, so the goodput
    lies below capacity and close to it; the search must land in [0.5, 1.0] x capacity and
    its bracket must straddle a pass/fail change of the real runs."""
    from trtpipe.runtime.measure.workload import WorkloadSpec, make_workload, run_workload
    from trtpipe.runtime.metrics.request_metrics import summarize

    class Tok:
        def encode(self, text, add_special_tokens=True):
            return list(range(1, 400))

    def probe(rate):
        llm = FakeServer(service_s=0.1)
        spec = WorkloadSpec("q", 200, 0, (1, 1), prompt_tokens=(4, 4), arrival_rate_per_s=rate, seed=5)
        metrics, wall_s, stats = run_workload(llm, make_workload(spec, Tok()), None, clock=llm.clock, sleep=llm.sleep)
        s = summarize(metrics, wall_s, stats)
        return ProbeResult(rate, s.latency_ms("ttft", "p95") <= 500.0, s.output_tokens_per_s)

    res = find_goodput("q", probe, 2.0, rel_tol=0.1, max_probes=12)
    assert 5.0 <= res.goodput_per_s <= 10.0, res.to_dict()
    assert probe(res.bracket[0]).passed and not probe(res.bracket[1]).passed


def test_each_probe_has_its_own_prefix_cache_salt():
    """The search repeats one scenario's prompts at every rate; with prefix caching a probe
    would hit the blocks the previous probe left and measure a warm cache (measured once: chat
    TTFT p95 62 ms at 0.5 req/s against 393 ms cold). Each probe gets one salt of its own, its
    warm-up request included (it seeds the probe's shared prefix, as in the gate run), and
    run_workload hands it to add_request."""
    from types import SimpleNamespace

    from trtpipe.pipeline.validate.goodput import ProbeRunner, _probe_fn
    from trtpipe.runtime.measure.workload import WorkloadSpec, run_workload

    class Tok:
        def encode(self, text, add_special_tokens=True):
            return list(range(1, 400))

    servers = []

    def run(items):
        servers.append(FakeServer(service_s=0.01))
        return run_workload(servers[-1], items, None, clock=servers[-1].clock, sleep=servers[-1].sleep)

    scenario = SimpleNamespace(name="q", budgets=SimpleNamespace(runtime_budgets=lambda: []))
    spec = WorkloadSpec("q", 6, 1, (1, 1), prompt_tokens=(4, 4), arrival_rate_per_s=1.0, seed=5)
    probe = _probe_fn(ProbeRunner(Tok(), None, run), scenario, spec, SimpleNamespace(print=lambda *a: None))
    probe(1.0)
    probe(2.0)
    salts = [s.salts for s in servers]
    assert [len(s) for s in salts] == [7, 7] and all(len(set(s)) == 1 for s in salts)  # 1 warm-up + 6
    assert salts[0][0] != salts[1][0] and None not in salts[0] + salts[1]


class FakeServer:
    """One request at a time, ``service_s`` each, one output token; time is a fake clock."""

    def __init__(self, service_s):
        from trtpipe.runtime.metrics.request_metrics import StepStats

        self.t = 0.0
        self.service_s = service_s
        self.queue = []
        self.step_stats = StepStats()
        self.block_pool = type("P", (), {"num_used": 0})()
        self.n = 0
        self.salts = []

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s

    def add_request(self, ids, params, arrival_s=None, cache_salt=None):
        from trtpipe.runtime.metrics.request_metrics import RequestTimer

        self.salts.append(cache_salt)
        self.n += 1
        rid = f"r{self.n}"
        self.queue.append(
            RequestTimer(
                rid, prompt_tokens=len(ids), arrival_s=self.t if arrival_s is None else arrival_s, clock=self.clock
            )
        )
        return rid

    def has_unfinished(self):
        return bool(self.queue)

    def step(self):
        timer = self.queue.pop(0)
        timer.on_prefill_start(self.t)
        self.t += self.service_s
        timer.on_prefill_end(self.t)
        timer.on_tokens(self.t, 1)
        timer.finish(self.t, "length")
        out = type("O", (), {"request_id": timer.request_id, "metrics": timer.metrics()})()
        self.step_stats.on_step(self.t, decode_batch_size=0, kv_blocks_used=0)
        return [out]
