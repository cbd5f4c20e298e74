"""Helpers for the server tests: a `trtpipe serve` subprocess on 127.0.0.1 that always stops, and
a Prometheus text reader. Every wait is bounded."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m trtpipe.pipeline.cli.main serve ARTIFACT --port P ...`` with its stderr collected.

    Use as a context manager: the server is SIGTERMed (then killed) on exit, whatever happened.
    """

    def __init__(self, artifact: Path, *args: str, ready_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "trtpipe.pipeline.cli.main",
            "serve",
            str(artifact),
            "--port",
            str(self.port),
            *args,
        ]
        self.ready_timeout_s = ready_timeout_s
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.health_while_loading: int | None = None

    def __enter__(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not any("ready at" in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not become ready:\n" + "".join(self.lines))
            if self.health_while_loading is None:  # the first answer of /health before "ready"
                try:
                    self.health_while_loading = httpx.get(self.url + "/health", timeout=1).status_code
                except httpx.TransportError:
                    pass  # not listening yet
            time.sleep(0.05)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metrics(self) -> dict[str, float]:
        return read_metrics(httpx.get(self.url + "/metrics", timeout=10).text)


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")


def read_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{labels without model_name}": value}; labels kept in order."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        labels = ",".join(p for p in (labels or "{}")[1:-1].split(",") if p and not p.startswith("model_name="))
        out[name + (f"{{{labels}}}" if labels else "")] = float(value)
    return out
