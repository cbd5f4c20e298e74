"""bench/serve.py's pure parts: rate choice, report figures (hand-computed), process-group cleanup.

The benchmark itself (servers + aiperf) is not run here: it installs its own tools and takes
minutes; these tests pin what its report claims and that it never leaves a process behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import serve  # noqa: E402
import serve_proc  # noqa: E402
import serve_report  # noqa: E402


def test_pick_rates_spans_the_slower_and_the_faster_server():
    # 0.25 x 1.0 = 0.25 to 1.25 x 3.2 = 4.0, geometric in 5 steps: ratio (4 / 0.25) ** (1/4) = 2.
    assert serve.pick_rates({"trtpipe": 3.2, "vllm": 1.0, "llama-server": 2.0}) == [0.25, 0.5, 1.0, 2.0, 4.0]
    # One capacity: 0.25 x to 1.25 x it, ratio 5 ** (1/4) = 1.4953; rounded to 3 digits.
    assert serve.pick_rates({"trtpipe": 4.0}) == [1.0, 1.5, 2.24, 3.34, 5.0]
    with pytest.raises(ValueError, match="no positive capacity"):
        serve.pick_rates({"vllm": 0.0})


def _metrics(ttft_p50, ttft_p95, itl_p90, tok_s, goodput, errors=0):
    return {
        "time_to_first_token": {"p50": ttft_p50, "p95": ttft_p95, "p99": ttft_p95},
        "inter_token_latency": {"p50": itl_p90, "p90": itl_p90, "p95": itl_p90, "p99": itl_p90},
        "output_token_throughput": {"avg": tok_s},
        "request_throughput": {"avg": 1.0},
        "completed_request_count": {"avg": 8 - errors},
        "goodput": {"avg": goodput},
        "error_summary": [{"error_details": {"code": 503}, "count": errors}] if errors else [],
    }


def _raw():
    slo = {"ttft_p95_ms": 200.0, "tpot_p90_ms": 50.0}
    runs = [
        {
            "engine": "trtpipe",
            "load": {"rate": 1.0},
            "metrics": _metrics(100, 180, 20, 60.0, 0.9),
            "foreign_load_cores": 0.1,
            "server_cmd": ["trtpipe", "serve"],
        },
        {
            "engine": "llama.cpp",
            "load": {"rate": 1.0},
            "metrics": _metrics(400, 500, 10, 30.0, 0.0, errors=2),
            "foreign_load_cores": 0.9,
            "server_cmd": ["python", "-m", "llama_cpp.server"],
        },
    ]
    meta = {
        "engines": ["trtpipe", "llama.cpp"],
        "slo": slo,
        "requests_per_rate": 8,
        "warmup_requests": 2,
        "command": "python bench/serve.py",
        "date": "d",
        "threads": 2,
        "wall_s": 60.0,
        "max_foreign_load": 0.3,
        "workload": {"num_requests": 10, "seed": 11, "prompt_tokens_mean": 80.0, "output_tokens_mean": 32.0},
        "versions": {},
        "machine": {"loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1]},
        "setup": {},
    }
    return {"meta": meta, "plan": {"rates": [1.0], "probe": {}}, "runs": runs}


def test_report_ratios_slo_and_goodput_are_the_hand_computed_ones():
    md = serve_report.render(_raw(), "## Analysis\n\nhand-written")
    rows = [ln for ln in md.splitlines() if ln.startswith("| 1 |")]
    trt, llama, ratio = rows
    # TTFT p50 100 / 400 = 0.25x, TTFT p95 180 / 500 = 0.36x, ITL 20 / 10 = 2.00x, tok/s 60 / 30 = 2.00x.
    assert ratio.split(" | ")[2:6] == ["0.25x", "0.36x", "0.36x", "2.00x"]
    assert "| 60.0 |" in trt and "| 0.90 | yes | 8/8 | 0 |" in trt  # TTFT p95 180 <= 200 and ITL p90 20 <= 50
    assert "| 0.00 | no | 6/8 | 2 |" in llama  # TTFT p95 500 > 200; two failed requests
    assert "**0.9 cores (noisy)**" in llama and "0.1 cores |" in trt
    assert "highest measured rate with TTFT p95 <= 200 ms and TPOT p90 <= 50 ms: **1 req/s**" in md
    assert "llama.cpp server (llama-cpp-python): highest measured rate" in md and "**none**" in md
    assert "hand-written" in md


def test_analysis_section_is_kept(tmp_path):
    doc = tmp_path / "serving.md"
    doc.write_text(serve_report.render(_raw(), "## Analysis\n\nkept text\n"))
    assert serve_report.read_analysis(doc).strip() == "## Analysis\n\nkept text"


def test_kill_group_stops_the_server_and_its_children(tmp_path):
    # A "server" that forks a child and ignores SIGTERM: the group must still be gone.
    script = (
        "import os, signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen(['sleep', '300']); time.sleep(300)"
    )
    p = serve_proc.spawn([sys.executable, "-c", script], dict(os.environ), tmp_path / "log")
    time.sleep(0.5)
    t0 = time.monotonic()
    serve_proc.kill_group(p, grace_s=0.5)
    assert time.monotonic() - t0 < 5
    assert p.returncode is not None and p not in serve_proc._LIVE
    for _ in range(30):  # the orphaned `sleep` is killed at once; PID 1 may take a moment to reap it
        left = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == []


def test_wait_ready_reports_a_server_that_exits(tmp_path):
    with serve_proc.ServerProcess(
        [sys.executable, "-c", "print('bad model'); raise SystemExit(3)"], dict(os.environ), tmp_path / "log"
    ) as srv:
        with pytest.raises(RuntimeError, match="exited with 3.*bad model"):
            srv.wait_ready(serve_proc.free_port(), "/health", timeout_s=30)
