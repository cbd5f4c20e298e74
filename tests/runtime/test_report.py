"""Report files: report.json (versioned, round-trips), report.md, PNG plots, rich table."""

import json
import os

import pytest

from trtpipe.runtime.budgets import BudgetResult, evaluate_budgets
from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.metrics import PERCENTILE_METHOD, RequestTimer, StepStats, summarize
from trtpipe.runtime.report import (
    SCHEMA_VERSION,
    ScenarioReport,
    atomic_write_bytes,
    build_report,
    load_report,
    render_rich_table,
    validate_dir,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GENERATED_AT = "2025-01-01T00:00:00+00:00"


def _req(request_id, prompt_tokens, arrival, token_times):
    t = RequestTimer(request_id, prompt_tokens=prompt_tokens, arrival_s=arrival)
    t.on_prefill_start(arrival + 0.05)
    t.on_prefill_end(token_times[0])
    for x in token_times:
        t.on_tokens(x, 1)
    t.finish(token_times[-1], "stop")
    return t.metrics()


def _scenarios():
    reqs = [_req("a", 10, 0.0, [0.5, 0.6, 0.8, 1.1]), _req("b", 40, 0.0, [0.3]),
            _req("c", 25, 1.0, [1.2, 1.6])]  # fmt: skip
    st = StepStats(num_kv_blocks=16)
    for t, b, kv in [(0.0, 0, 4), (0.3, 2, 6), (0.6, 2, 6), (1.2, 1, 3)]:
        st.on_step(t, decode_batch_size=b, kv_blocks_used=kv)
    st.on_rss(123 * 2**20)
    st.on_run_end(0)
    summary = summarize(reqs, wall_s=2.0, step_stats=st)
    budgets = [
        {"metric": "ttft_ms", "percentile": "p95", "max": 500.0},
        {"metric": "tpot_ms", "percentile": "p50", "max": 250.0},  # fails: 300 ms
        {"metric": "output_tokens_per_s", "min": 3.0},
    ]
    chat = ("chat", summary, evaluate_budgets(summary, budgets), reqs)
    # A second scenario where every request is single-token: no TPOT/ITL data at all.
    single = [_req("s", 5, 0.0, [0.1])]
    s2 = summarize(single, wall_s=1.0)
    results2 = evaluate_budgets(s2, [{"metric": "tpot_ms", "percentile": "p95", "max": 100.0}])
    return [chat, ScenarioReport("single", s2, tuple(results2), tuple(single))]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = validate_dir(tmp_path_factory.mktemp("artifacts"), "smollm2", "cpu")
    paths = write_report(
        out,
        recipe_name="smollm2",
        target="cpu",
        scenarios=_scenarios(),
        correctness={"passed": True, "greedy_match": "32/32"},
        env={"backend": "ort", "onnxruntime": "1.20.0"},
        generated_at=GENERATED_AT,
    )
    return out, paths


def test_files_exist_under_validate_dir(written):
    out, paths = written
    assert out.parts[-3:] == ("smollm2", "cpu", "validate")
    names = sorted(p.name for p in paths.all())
    assert names == sorted([
        "report.json", "report.md", "ttft_vs_prompt_len.png", "tpot_cdf.png", "itl_cdf.png",
        "kv_occupancy.png",
    ])  # fmt: skip
    for p in paths.all():
        assert p.parent == out and p.stat().st_size > 0
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]  # no temp files left behind


def test_pngs_are_valid(written):
    _, paths = written
    for p in (paths.ttft_vs_prompt_len, paths.tpot_cdf, paths.itl_cdf, paths.kv_occupancy):
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC, p
        assert data[12:16] == b"IHDR"


def test_report_json_round_trips(written):
    _, paths = written
    doc = load_report(paths.report_json)
    expected = build_report(
        recipe_name="smollm2",
        target="cpu",
        scenarios=_scenarios(),
        correctness={"passed": True, "greedy_match": "32/32"},
        env={"backend": "ort", "onnxruntime": "1.20.0"},
        generated_at=GENERATED_AT,
    )
    assert doc == json.loads(json.dumps(expected))
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["percentile_method"] == PERCENTILE_METHOD
    chat = doc["scenarios"][0]
    assert chat["summary"]["ttft_ms"]["p95"] == pytest.approx(480.0)
    assert chat["summary"]["kv_leak_free"] is True
    assert chat["summary"]["peak_kv_blocks_used"] == 6
    assert [BudgetResult.from_dict(b) for b in chat["budgets"]] == list(_scenarios()[0][2])
    assert [r["request_id"] for r in chat["requests"]] == ["a", "b", "c"]
    assert chat["requests"][1]["tpot_ms"] is None
    # One failed budget in "chat" and the no-data budget in "single": the gate fails.
    assert doc["gate"] == {
        "passed": False, "exit_code": 1, "budgets_passed": False,
        "correctness_passed": True, "kv_leak_free": True,
    }  # fmt: skip


def test_report_md_has_tables_and_method(written):
    _, paths = written
    md = paths.report_md.read_text()
    assert "interpolation: linear (numpy default, Hyndman-Fan type 7)" in md
    assert "## Scenario `chat`" in md and "## Scenario `single`" in md
    assert "| ttft_ms p95 | ≤ 500 ms | 480.00 | +4.0% | PASS |" in md
    assert "| tpot_ms p50 | ≤ 250 ms | 300.00 | -20.0% | FAIL |" in md
    assert "| output_tokens_per_s | ≥ 3 tokens/s | 3.50 | +16.7% | PASS |" in md
    assert "no data" in md
    assert "**Gate: FAIL** (exit code 1)" in md
    assert "![kv_occupancy.png](kv_occupancy.png)" in md


def test_load_report_refuses_other_schema(tmp_path):
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ArtifactError, match="schema_version=99"):
        load_report(p)


def test_atomic_write_replaces_and_cleans_up(tmp_path):
    p = tmp_path / "f.bin"
    atomic_write_bytes(p, b"one")
    atomic_write_bytes(p, b"two")
    assert p.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_render_rich_table():
    from rich.console import Console

    results = [
        BudgetResult("ttft_ms", "p95", "max", 500.0, 480.0, 0.04, True, ""),
        BudgetResult("tpot_ms", "p95", "max", 100.0, None, None, False, "no data: [none]"),
    ]
    table = render_rich_table(results, title="chat")
    assert table.row_count == 2
    console = Console(width=160, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "ttft_ms p95" in text and "480.00 ms" in text and "+4.0%" in text and "PASS" in text
    assert "FAIL (no data: [none])" in text
