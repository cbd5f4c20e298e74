"""The first-token stages (runtime/serve/first_token_path.py): durations from hand-set stamps, and
the /metrics round trip that validate --url reads (prometheus_client's own exposition text)."""

from __future__ import annotations

import math

import pytest

from trtpipe.runtime.serve.first_token_path import (
    STAGES,
    EngineStamps,
    HandlerStamps,
    first_token_path_s,
    mean_ms_between,
    read_first_token_path,
)


def test_stages_are_the_gaps_between_consecutive_stamps():
    handler = HandlerStamps(received_s=10.0, parsed_s=10.001, encoded_s=10.003, submitted_s=10.0035)
    engine = EngineStamps(taken_s=10.004, step_end_s=10.044, posted_s=10.0441)
    got = first_token_path_s(handler, engine, written_s=10.046)
    want = [0.001, 0.002, 0.0005, 0.0005, 0.040, 0.0001, 0.0019]  # by hand
    assert list(got) == list(STAGES)
    assert all(math.isclose(g, w, abs_tol=1e-9) for g, w in zip(got.values(), want))
    assert math.isclose(sum(got.values()), 0.046, abs_tol=1e-9)  # received -> written


@pytest.mark.parametrize("field", ["parsed_s", "taken_s"])
def test_a_missing_or_out_of_order_stamp_is_refused(field):
    handler = HandlerStamps(received_s=1.0, parsed_s=2.0, encoded_s=3.0, submitted_s=4.0)
    engine = EngineStamps(taken_s=5.0, step_end_s=6.0, posted_s=7.0)
    if field == "parsed_s":
        handler.parsed_s = 0.0  # never stamped
    else:
        engine = EngineStamps(taken_s=3.5, step_end_s=6.0, posted_s=7.0)  # taken before submitted
    with pytest.raises(ValueError, match="non-decreasing"):
        first_token_path_s(handler, engine, 8.0)


def test_metrics_text_round_trip_and_means_between_two_readings():
    pytest.importorskip("prometheus_client")
    from trtpipe.runtime.serve.prometheus import ServeMetrics

    metrics = ServeMetrics("m")
    metrics.on_first_token_path({stage: 0.001 * (i + 1) for i, stage in enumerate(STAGES)})
    before = read_first_token_path(metrics.render().decode())
    assert before["parse"] == (0.001, 1) and before["write"] == (0.007, 1)
    metrics.on_first_token_path({stage: 0.003 for stage in STAGES})
    metrics.on_first_token_path({stage: 0.005 for stage in STAGES})
    after = read_first_token_path(metrics.render().decode())
    assert after["engine"][1] == 3 and math.isclose(after["engine"][0], 0.005 + 0.003 + 0.005)
    means = dict(mean_ms_between(before, after))
    assert list(means) == list(STAGES)
    assert all(math.isclose(v, 4.0) for v in means.values())  # (3 + 5) / 2 ms, by hand
    assert mean_ms_between(after, after) == ()  # nothing observed in between
    assert read_first_token_path("vllm:time_to_first_token_seconds_sum 1.0\n") == {}  # another server
