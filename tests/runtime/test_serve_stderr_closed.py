"""`trtpipe serve` stops on SIGINT/SIGTERM even when nobody reads its stderr any more (piped into
`head`, a log collector that died): the drain thread's "shutting down" line raised BrokenPipeError
and the server stayed up answering 503 until a second SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_util import free_port  # noqa: E402

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_exits_on_a_signal_after_its_stderr_reader_left(default_artifact, sig):
    port = free_port()
    cmd = [sys.executable, "-m", "trtpipe.pipeline.cli.main", "serve", str(default_artifact), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        for line in proc.stderr:
            if "ready at" in line or time.monotonic() > deadline:
                break
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        proc.stderr.close()  # the reader leaves: every later write to stderr gets EPIPE
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0  # was: still running, /health 503 "shutting_down"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
