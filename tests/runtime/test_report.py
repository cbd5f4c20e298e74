"""Report files: report.json (versioned, round-trips), report.md, PNG plots, rich table."""

import dataclasses
import importlib.util
import json
import os

import pytest

from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.measure.budgets import BudgetResult, evaluate_budgets
from trtpipe.runtime.measure.report.document import (
    SCHEMA_VERSION,
    ScenarioReport,
    atomic_write_bytes,
    build_report,
    load_report,
    render_rich_table,
    validate_dir,
    write_report,
)
from trtpipe.runtime.metrics.request_metrics import PERCENTILE_METHOD, RequestTimer, StepStats, summarize

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


# ---------------------------------------------------------------------------------------------
# Plot layout (figures inspected before they are rendered) and plots without matplotlib
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def figures(monkeypatch):
    from trtpipe.runtime.measure.report import plots as report_plots

    captured = []
    monkeypatch.setattr(report_plots, "_png", lambda fig: captured.append(fig) or b"")
    return report_plots, captured


def _dashed_x(ax):
    return sorted(ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--")


def test_cdfs_one_panel_per_scenario_with_only_its_budgets_on_log_axes(figures):
    rp, figs = figures
    scen = [_as(s) for s in _scenarios()]
    rp.plot_latency_cdf(scen, "tpot")
    (fig,) = figs
    chat, single = fig.axes
    assert chat.get_title(loc="left") == "chat" and single.get_title(loc="left") == "single"
    assert chat.get_xscale() == single.get_xscale() == "log"
    assert _dashed_x(chat) == [250.0] and _dashed_x(single) == [100.0]  # each scenario's own budget
    assert chat.get_xlim() == single.get_xlim()  # one time axis to compare by eye
    lo, hi = chat.get_xlim()
    assert lo < 100.0 and hi > 300.0  # covers the budgets and the 300 ms TPOT


def test_ttft_budget_only_on_its_panel(figures):
    rp, figs = figures
    rp.plot_ttft_vs_prompt([_as(s) for s in _scenarios()])
    chat, single = figs[0].axes
    dashed = [ln for ln in chat.get_lines() if ln.get_linestyle() == "--"]
    assert [ln.get_ydata()[0] for ln in dashed] == [500.0]
    assert not [ln for ln in single.get_lines() if ln.get_linestyle() == "--"]


def test_kv_occupancy_is_one_line_against_one_capacity(figures):
    rp, figs = figures
    chat = _as(_scenarios()[0])  # 16-block pool, peak 6
    rp.plot_kv_occupancy([chat, chat, chat])
    (ax,) = figs[0].axes
    used = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert len(used) == 1 and len(used[0].get_xdata()) == 3 * len(chat.summary.kv_occupancy)
    assert max(used[0].get_ydata()) == 6
    labels = ax.get_legend_handles_labels()[1]
    assert sum("pool capacity 16 blocks" in lb for lb in labels) == 1
    # the peak uses most of the height: the 16-block capacity lies above the panel
    assert ax.get_ylim() == (0, 6 * 1.25)
    assert "peak 6 of 16 blocks, 37.5 %" in figs[0].get_suptitle()
    # a pool close to full: the capacity line is drawn inside the panel
    figs.clear()
    big = chat.__class__(
        chat.name, dataclasses.replace(chat.summary, num_kv_blocks=7), chat.budget_results, chat.requests
    )
    rp.plot_kv_occupancy([big])
    (ax,) = figs[0].axes
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"] == [7]


def test_report_without_matplotlib_skips_plots_with_a_notice(tmp_path, monkeypatch):
    from trtpipe.runtime.measure.report import plots as report_plots

    monkeypatch.setattr(
        report_plots.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else importlib.util.find_spec(name, *a),
    )
    assert not report_plots.plots_available()
    paths = write_report(
        tmp_path, recipe_name="r", target="cpu", scenarios=_scenarios(), correctness={"passed": True}, env={}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]
    assert paths.plots() == () and "pip install 'trtpipe[plots]'" in paths.notice and "\n" not in paths.notice
    assert load_report(paths.report_json)["plots"] == []
    assert "not drawn (matplotlib is not installed)" in paths.report_md.read_text()


def _as(item):
    from trtpipe.runtime.measure.report.document import _as_scenario

    return _as_scenario(item)
