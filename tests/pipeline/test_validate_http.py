"""`trtpipe validate --url` against a live `trtpipe serve` (real model, loopback): the same
report and gate as in-process, measured at the client, and the report says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from serve_util import ServerProcess  # noqa: E402

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")


def _recipe(tmp_path: Path, ttft_p50_ms: float) -> Path:
    """The default recipe with one small scenario (4 requests) and a TTFT budget."""
    from trtpipe.pipeline.recipe import resolve_recipe_path

    data = yaml.safe_load(Path(resolve_recipe_path("smollm2-135m-cpu")).read_text())
    data["validate"]["scenarios"] = [
        {
            "name": "tiny",
            "num_requests": 4,
            "num_warmup_requests": 1,
            "prompt_tokens": {"uniform": {"min": 16, "max": 32}},
            "output_tokens": 6,
            "concurrency": 2,
            "seed": 5,
            "budgets": {"ttft_ms": {"p50": ttft_p50_ms}},
        }
    ]
    path = tmp_path / f"ttft-{ttft_p50_ms:g}" / "smollm2-135m-cpu.yaml"  # named as its recipe: reports in validate/
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def server(default_artifact):
    with ServerProcess(default_artifact) as s:
        yield s


def test_validate_url_measures_at_the_client(server, tmp_path):
    from trtpipe.pipeline.validate.http import MEASURED_BY, run_validate_http

    code = run_validate_http(_recipe(tmp_path, 60000), url=server.url, artifact_dir=tmp_path / "art")
    doc = json.loads((tmp_path / "art" / "validate" / "http" / "report.json").read_text())
    assert code == 0 and doc["gate"]["passed"] is True
    assert doc["env"]["measured_by"] == MEASURED_BY and doc["env"]["url"] == server.url
    scen = doc["scenarios"][0]
    assert scen["summary"]["num_requests"] == 4
    assert scen["summary"]["total_output_tokens"] == 4 * 6  # every token id reached the client
    assert scen["summary"]["ttft_ms"]["count"] == 4 and scen["summary"]["itl_ms"]["count"] == 4 * 5
    assert scen["summary"]["kv_blocks_in_use_at_end"] == 0
    assert doc["gate"]["correctness_passed"] is None  # golden check is in-process only
    # the server's split of the first token's path, over the scenario's 4 streams: every stage,
    # each >= 0, together no longer than the mean TTFT the client measured around them
    path = scen["summary"]["server_first_token_path_ms"]
    assert list(path) == ["parse", "tokenize", "submit", "pickup", "engine", "publish", "write"]
    assert min(path.values()) >= 0 and sum(path.values()) <= scen["summary"]["ttft_ms"]["mean"]


def test_validate_url_gate_fails_and_wrong_server_is_usage_error(server, tmp_path):
    """A budget no HTTP request can meet: exit 1 through the CLI; a server of another model: exit 2."""
    cmd = [
        sys.executable,
        "-m",
        "trtpipe.pipeline.cli.main",
        "validate",
        str(_recipe(tmp_path, 0.001)),
        "--url",
        server.url,
        "--artifact",
        str(tmp_path / "art"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "FAIL" in r.stdout
    data = yaml.safe_load(_recipe(tmp_path, 1).read_text())
    data["name"] = "another-model"
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(data))
    r = subprocess.run(cmd[:4] + [str(other), "--url", server.url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not recipe 'another-model'" in r.stderr


def test_goodput_over_http(server, tmp_path):
    """--goodput with --url: the bisection probes the live server (Poisson arrivals, timed at the
    client) and writes goodput.json/.png next to the HTTP report. A budget every rate meets: each
    probe passes, so the search only climbs (rates double from the scenario's) until its probe or
    time limit."""
    data = yaml.safe_load(_recipe(tmp_path, 60000).read_text())
    scen = data["validate"]["scenarios"][0]
    del scen["concurrency"]
    scen.update(arrival_rate_per_s=2.0, num_requests=3, output_tokens=4)
    path = tmp_path / "poisson" / "smollm2-135m-cpu.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    cmd = [
        sys.executable,
        "-m",
        "trtpipe.pipeline.cli.main",
        "validate",
        str(path),
        "--url",
        server.url,
        "--artifact",
        str(tmp_path / "art"),
        "--goodput",
        "--goodput-time-s",
        "20",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "goodput over HTTP: the server's own scheduler settings apply" in r.stderr
    out = tmp_path / "art" / "validate" / "http"
    [res] = json.loads((out / "goodput.json").read_text())
    assert res["scenario"] == "tiny" and (out / "goodput.png").stat().st_size > 0
    rates = [p["rate_per_s"] for p in res["probes"]]
    assert rates[0] == 2.0 and all(p["passed"] for p in res["probes"]) and len(rates) >= 2
    assert res["goodput_requests_per_s"] == max(rates) and rates == sorted(rates)


def test_serve_flag_starts_the_server_with_the_recipes_runtime_settings(tmp_path, default_artifact):
    """`validate RECIPE --serve` served the artifact folder with its defaults (prefix caching on,
    no budget: FCFS chunks), whatever the recipe's runtime.prefix_caching and scheduler said."""
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.pipeline.validate.http import serve_command

    data = yaml.safe_load(_recipe(tmp_path, 1000).read_text())
    data["runtime"] = {
        "prefix_caching": False,
        "scheduler": {"tpot_budget_ms": 50, "itl_budget_ms": 100, "itl_during_prefill_ratio": 1.5},
    }
    path = tmp_path / "budgets" / "smollm2-135m-cpu.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    cmd = serve_command(default_artifact, 1234, 2, load_recipe(path))
    flags = cmd[cmd.index("--port") + 2 :]
    assert flags == [
        "--threads", "2", "--no-prefix-caching", "--scheduler-policy", "slo",
        "--tpot-budget-ms", "50.0", "--itl-budget-ms", "100.0", "--itl-during-prefill-ratio", "1.5",
    ]  # fmt: skip
    data["runtime"]["scheduler"] = {"itl_budget_ms": 100}  # no TPOT budget: the ITL budget is also the TPOT budget
    path.write_text(yaml.safe_dump(data))
    cmd = serve_command(default_artifact, 1234, None, load_recipe(path))
    assert cmd[cmd.index("--port") + 2 :] == [
        "--no-prefix-caching",
        "--scheduler-policy",
        "slo",
        "--itl-budget-ms",
        "100.0",
    ]
    data["runtime"]["speculative"] = {"method": "ngram", "max_k": 3, "min_n": 1, "max_n": 2}
    path.write_text(yaml.safe_dump(data))
    cmd = serve_command(default_artifact, 1234, None, load_recipe(path))
    assert cmd[cmd.index("--itl-budget-ms") + 2 :] == [
        "--speculative", "ngram", "--speculative-max-k", "3", "--speculative-ngram", "1", "2",
    ]  # fmt: skip
    del data["runtime"]["speculative"]
    data["runtime"]["scheduler"] = {"policy": "fcfs", "itl_budget_ms": 100}  # serve refuses --itl-budget-ms under fcfs
    path.write_text(yaml.safe_dump(data))
    cmd = serve_command(default_artifact, 1234, None, load_recipe(path))
    assert cmd[cmd.index("--port") + 2 :] == ["--no-prefix-caching", "--scheduler-policy", "fcfs"]
    with ServerProcess(default_artifact, *flags[2:]) as s:
        text = "".join(s.lines)
        assert (
            "overridden: prefix_caching=False, scheduler_policy=slo, tpot_budget_ms=50.0, itl_budget_ms=100.0, "
            "itl_during_prefill_ratio=1.5" in text
        )
        assert "prefix caching off; scheduler slo; prefill chunks: slo: TPOT budget 50 ms; ITL budget 100 ms" in text
        assert "steps beside decodes up to 1.5x the decode-only step" in text and "(never below one token)" in text


@pytest.mark.parametrize(
    "status, body, fix",
    [
        (
            404,
            "<!DOCTYPE HTML>\n<html>" + "x" * 400 + "</html>",
            "this is not an OpenAI-compatible server (no /v1/models)",
        ),
        (401, '{"error": "bad key"}', "pass the server's --api-key"),
        (503, "loading", "the server is still loading: wait until its /health answers 200"),
        (200, "<html>not json</html>", "check that --url is a `trtpipe serve`"),
    ],
)
def test_url_that_is_not_a_trtpipe_server_says_why_and_cuts_the_body(monkeypatch, status, body, fix):
    """A new-user trial pointed --url at `python -m http.server`: the 404's whole HTML page was
    printed and the fix said to pass --api-key."""
    import httpx

    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.validate.http import _served_model
    from trtpipe.pipeline.validate.runner import ValidateUsageError

    recipe = load_recipe(resolve_recipe_path("smollm2-135m-cpu"), check_files=False)
    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Response(status, text=body))
    with pytest.raises(ValidateUsageError) as e:
        _served_model("http://127.0.0.1:18433", recipe, {})
    msg = str(e.value)
    assert msg.startswith(f"--url http://127.0.0.1:18433: GET /v1/models answered HTTP {status}")
    assert f"Fix: {fix}" in msg and len(msg) < 420 and "\n" not in msg


def test_unreachable_url_names_a_serve_command_listening_there(monkeypatch):
    import httpx

    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.validate.http import _served_model
    from trtpipe.pipeline.validate.runner import ValidateUsageError

    recipe = load_recipe(resolve_recipe_path("smollm2-135m-cpu"), check_files=False)

    def refused(url, **kw):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(httpx, "get", refused)
    for url, cmd in (
        ("http://127.0.0.1:1", "trtpipe serve smollm2-135m-cpu --port 1"),
        ("http://127.0.0.1:8000", "trtpipe serve smollm2-135m-cpu"),
        ("http://localhost:9000", "trtpipe serve smollm2-135m-cpu --host localhost --port 9000"),
    ):
        with pytest.raises(ValidateUsageError, match=f"Fix: start it with `{cmd}` or pass --serve."):
            _served_model(url, recipe, {})


def test_probe_limits_without_a_local_artifact_are_said_with_the_fix(tmp_path):
    import io

    from rich.console import Console

    from trtpipe.pipeline.validate.http import ASSUMED_SERVER_LIMITS, _server_limits

    buf = io.StringIO()
    assert _server_limits(tmp_path / "absent", Console(file=buf, width=400)) == ASSUMED_SERVER_LIMITS
    line = buf.getvalue()
    assert "max_batch_size = 16 and max_seq_len = 2048" in line and "pass --artifact DIR" in line
