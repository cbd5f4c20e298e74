"""Metrics with hand-computed values (DESIGN.md "Metrics")."""

import random

import numpy as np
import pytest

from trtpipe.runtime.metrics.request_metrics import (
    PERCENTILE_METHOD,
    MetricsError,
    RequestTimer,
    StepStats,
    percentile,
    read_peak_rss_bytes,
    summarize,
)


def _timer(request_id, arrival, token_times, prompt_tokens=10):
    t = RequestTimer(request_id, prompt_tokens=prompt_tokens, arrival_s=arrival)
    for x in token_times:
        t.on_tokens(x, 1)
    t.finish(token_times[-1] if token_times else arrival, "stop")
    return t.metrics()


# --- per request ---------------------------------------------------------------------------


def test_basic_request_hand_computed():
    # arrival 0, tokens at 0.5, 0.6, 0.8, 1.1
    m = _timer("a", 0.0, [0.5, 0.6, 0.8, 1.1])
    assert m.output_tokens == 4
    assert m.ttft_s == pytest.approx(0.5)
    assert m.tpot_s == pytest.approx((1.1 - 0.5) / 3)  # 0.2
    assert m.tpot_s == pytest.approx(0.2)
    assert m.itl_s == pytest.approx((0.1, 0.2, 0.3))
    assert m.e2e_s == pytest.approx(1.1)
    assert m.finish_reason == "stop"


def test_ttft_includes_queueing_and_prefill_is_reported_separately():
    t = RequestTimer("q", prompt_tokens=7, arrival_s=1.0)
    t.on_prefill_start(1.25)  # 0.25 s queued
    t.on_prefill_end(1.40)  # 0.15 s prefill
    t.on_tokens(1.5, 1, "Hi")
    m = t.metrics()
    assert m.queue_s == pytest.approx(0.25)
    assert m.prefill_s == pytest.approx(0.15)
    assert m.ttft_s == pytest.approx(0.5)  # from arrival, not from prefill start


def test_chunked_prefill_spans_first_start_to_last_end():
    t = RequestTimer("c", arrival_s=0.0)
    t.on_prefill_start(0.1)
    t.on_prefill_end(0.2)
    t.on_prefill_start(0.3)  # second chunk: the first start keeps the queueing time
    t.on_prefill_end(0.45)
    m = t.metrics()
    assert m.queue_s == pytest.approx(0.1)
    assert m.prefill_s == pytest.approx(0.35)


def test_one_token_request_has_no_tpot():
    m = _timer("one", 0.0, [0.3])
    assert m.tpot_s is None
    assert m.itl_s == ()
    assert m.ttft_s == pytest.approx(0.3)
    assert m.e2e_s == pytest.approx(0.3)


def test_empty_first_chunk_is_not_the_first_token():
    t = RequestTimer("e", arrival_s=0.0)
    t.on_tokens(0.2, 0, "")  # empty chunk (e.g. a role header in a stream)
    t.on_tokens(0.5, 1, "a")
    t.on_tokens(0.7, 0, "")  # an empty chunk in the middle adds no gap either
    t.on_tokens(0.9, 1, "b")
    m = t.metrics()
    assert m.ttft_s == pytest.approx(0.5)
    assert m.itl_s == pytest.approx((0.4,))
    assert m.output_tokens == 2


def test_itl_never_contains_ttft():
    m = _timer("x", 0.0, [0.5, 0.6])
    assert m.ttft_s == pytest.approx(0.5)
    assert m.itl_s == pytest.approx((0.1,))
    s = summarize([m], wall_s=1.0)
    assert s.itl.count == 1
    assert s.itl.max == pytest.approx(0.1)  # 0.5 (the TTFT) is not an ITL sample


def test_multi_token_step_records_every_token_at_t():
    t = RequestTimer("m", arrival_s=0.0)
    t.on_tokens(0.5, 1)
    t.on_tokens(0.7, 3)  # e.g. speculative / multi-token step
    m = t.metrics()
    assert m.output_tokens == 4
    assert m.itl_s == pytest.approx((0.2, 0.0, 0.0))
    assert m.tpot_s == pytest.approx(0.2 / 3)


def test_no_output_request():
    t = RequestTimer("n", arrival_s=0.0)
    t.finish(0.4, "abort")
    m = t.metrics()
    assert (m.output_tokens, m.ttft_s, m.tpot_s, m.e2e_s, m.itl_s) == (0, None, None, None, ())


def test_default_clock_is_injectable_and_events_must_not_go_back():
    times = iter([10.0, 10.5, 10.75])
    t = RequestTimer("clk", clock=lambda: next(times))  # arrival = 10.0
    t.on_tokens(None, 1)  # 10.5
    t.on_tokens(None, 1)  # 10.75
    m = t.metrics()
    assert m.ttft_s == pytest.approx(0.5)
    assert m.itl_s == pytest.approx((0.25,))
    with pytest.raises(MetricsError, match="earlier than the previous"):
        t.on_tokens(10.6, 1)


def test_bad_events_raise():
    t = RequestTimer("b", arrival_s=0.0)
    with pytest.raises(MetricsError, match="num_tokens=-1"):
        t.on_tokens(0.1, -1)
    with pytest.raises(MetricsError, match="before on_prefill_start"):
        t.on_prefill_end(0.1)


# --- percentiles ---------------------------------------------------------------------------


def test_percentile_hand_computed():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([4, 1, 3, 2], 0) == 1.0  # order does not matter
    assert percentile([1, 2, 3, 4], 100) == 4.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_matches_numpy_linear():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 50, 90, 95, 99, 100):
            assert percentile(xs, q) == pytest.approx(np.percentile(xs, q, method="linear"))
    assert "linear" in PERCENTILE_METHOD and "type 7" in PERCENTILE_METHOD


def test_percentile_errors():
    with pytest.raises(MetricsError, match="empty"):
        percentile([], 50)
    with pytest.raises(MetricsError, match="q=101"):
        percentile([1.0], 101)


# --- summary -------------------------------------------------------------------------------


def _three_requests():
    a = _timer("a", 0.0, [0.5, 0.6, 0.8, 1.1], prompt_tokens=10)  # ttft .5 tpot .2 e2e 1.1
    b = _timer("b", 0.0, [0.3], prompt_tokens=20)  # ttft .3, no tpot, e2e .3
    c = _timer("c", 1.0, [1.2, 1.6], prompt_tokens=30)  # ttft .2 tpot .4 itl [.4] e2e .6
    return [a, b, c]


def test_summarize_hand_computed():
    s = summarize(_three_requests(), wall_s=2.0)
    assert s.num_requests == 3
    assert s.total_output_tokens == 7
    assert s.total_prompt_tokens == 60
    assert s.output_tokens_per_s == pytest.approx(3.5)
    # TTFT sorted [0.2, 0.3, 0.5]: p50 = 0.3; p90: h = 1.8 -> 0.3 + 0.8*0.2 = 0.46
    assert s.ttft.p50 == pytest.approx(0.3)
    assert s.ttft.p90 == pytest.approx(0.46)
    assert s.ttft.p95 == pytest.approx(0.48)
    assert s.ttft.p99 == pytest.approx(0.496)
    # TPOT over requests with >= 2 tokens only: [0.2, 0.4] (b excluded, not zero)
    assert s.tpot.count == 2
    assert s.tpot.p50 == pytest.approx(0.3)
    assert s.tpot.p90 == pytest.approx(0.38)
    assert s.tpot.min == pytest.approx(0.2)
    # ITL over all tokens: [0.1, 0.2, 0.3, 0.4]
    assert s.itl.count == 4
    assert s.itl.p50 == pytest.approx(0.25)
    assert s.itl.p90 == pytest.approx(0.37)
    # E2E [0.3, 0.6, 1.1]
    assert s.e2e.p50 == pytest.approx(0.6)
    assert s.e2e.mean == pytest.approx(2.0 / 3)


def test_summary_dict_reports_ms_and_method():
    s = summarize(_three_requests(), wall_s=2.0)
    d = s.to_dict()
    assert d["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert d["tpot_ms"]["count"] == 2
    assert d["itl_ms"]["p90"] == pytest.approx(370.0)
    assert d["percentile_method"] == PERCENTILE_METHOD
    assert d["prefill_ms"] is None  # no prefill events recorded
    assert s.latency_ms("ttft", "p50") == pytest.approx(300.0)


def test_all_single_token_requests_have_no_tpot_distribution():
    s = summarize([_timer("a", 0.0, [0.1]), _timer("b", 0.0, [0.2])], wall_s=1.0)
    assert s.tpot is None and s.itl is None
    assert s.latency_ms("tpot", "p95") is None
    assert s.to_dict()["tpot_ms"] is None


def test_step_stats_hand_computed():
    st = StepStats(num_kv_blocks=16)
    for t, b, kv in [(10.0, 0, 4), (10.1, 2, 6), (10.2, 3, 7), (10.3, 1, 5)]:
        st.on_step(t, decode_batch_size=b, kv_blocks_used=kv)
    st.on_rss(1000)
    st.on_rss(3000)
    st.on_rss(2000)
    st.on_run_end(0)
    s = summarize(_three_requests(), wall_s=2.0, step_stats=st)
    assert s.peak_decode_batch_size == 3
    assert s.mean_decode_batch_size == pytest.approx(2.0)  # (2+3+1)/3, prefill-only step excluded
    assert s.peak_kv_blocks_used == 7
    assert [t for t, _ in s.kv_occupancy] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert [n for _, n in s.kv_occupancy] == [4, 6, 7, 5]
    assert s.peak_rss_bytes == 3000
    assert s.kv_leak_free is True


def test_leak_check_detects_blocks_in_use():
    st = StepStats()
    st.on_run_end(2)
    s = summarize([], wall_s=1.0, step_stats=st)
    assert s.kv_leak_free is False
    assert summarize([], wall_s=1.0).kv_leak_free is None  # not checked


def test_read_peak_rss_bytes_is_plausible():
    assert read_peak_rss_bytes() > 1 << 20  # a Python process is more than 1 MiB


def test_zero_wall_time_has_no_throughput():
    assert summarize([], wall_s=0.0).output_tokens_per_s is None
    with pytest.raises(MetricsError, match="wall_s"):
        summarize([], wall_s=-1.0)


def test_runtime_metrics_does_not_import_torch_or_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys, trtpipe.runtime.metrics.request_metrics, trtpipe.runtime.measure.budgets, trtpipe.runtime.measure.report.document;"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
