"""Speculative decoding's Prometheus series (vLLM's spec_decode_* names) and per-scenario deltas,
from hand-made counters."""

from prometheus_client import CollectorRegistry, generate_latest

from trtpipe.runtime.metrics.spec_counters import SpeculationCounters
from trtpipe.runtime.serve.spec_metrics import SpecMetrics


def test_counters_render_as_vllm_named_series_and_a_length_histogram():
    reg = CollectorRegistry()
    m = SpecMetrics(reg, "m", max_length=5)
    c = SpeculationCounters(3, 9, 4, [2, 1, 1], [0, 1, 1, 0, 1])  # verifies emitting 1, 2 and 4 tokens
    m.update(c)
    m.update(c)  # no new verifies: nothing added
    text = generate_latest(reg).decode()
    assert 'trtpipe:spec_decode_num_drafts_total{model_name="m"} 3.0' in text
    assert 'trtpipe:spec_decode_num_draft_tokens_total{model_name="m"} 9.0' in text
    assert 'trtpipe:spec_decode_num_accepted_tokens_total{model_name="m"} 4.0' in text
    assert 'trtpipe:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 2.0' in text
    assert 'trtpipe:spec_decode_acceptance_length_bucket{le="2.0",model_name="m"} 2.0' in text
    assert 'trtpipe:spec_decode_acceptance_length_sum{model_name="m"} 7.0' in text
    assert 'trtpipe:spec_decode_acceptance_length_count{model_name="m"} 3.0' in text


def test_since_gives_a_scenarios_rates():
    before = SpeculationCounters(1, 4, 2, [1, 1, 0, 0], [0, 0, 0, 1, 0, 0])
    after = SpeculationCounters(5, 14, 7, [3, 2, 2, 0], [0, 1, 1, 3, 0, 0])
    d = after.since(before)
    assert d["num_drafts"] == 4 and d["num_draft_tokens"] == 10 and d["num_accepted_tokens"] == 5
    assert d["acceptance_rate"] == 0.5 and d["mean_acceptance_length"] == 1 + 5 / 4
    assert d["acceptance_length_counts"] == [0, 1, 1, 2, 0, 0]
    assert "5/10 proposed tokens accepted (50%)" in SpeculationCounters.line(d)
