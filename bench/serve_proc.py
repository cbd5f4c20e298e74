"""Subprocesses of bench/serve.py: a server on 127.0.0.1 that is always stopped, and CPU accounting.

Every process is started in its own session (``start_new_session``), so stopping it means signalling
its whole process group (aiperf and uvicorn spawn workers): SIGTERM, a grace period, then SIGKILL.
Live groups are also registered with ``atexit``, so an exception or a SIGTERM turned into
``SystemExit`` in the orchestrator never leaves a server behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

_LIVE: set[subprocess.Popen] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``p``, wait up to ``grace_s``, then SIGKILL it."""
    try:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group, even when the leader is gone
    except ProcessLookupError:
        pass
    p.wait()
    _LIVE.discard(p)


@atexit.register
def _kill_all() -> None:
    for p in list(_LIVE):
        kill_group(p, grace_s=3.0)


def spawn(cmd: list[str], env: dict, log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session, output to ``log``; registered for killing at exit."""
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL
        )
    _LIVE.add(p)
    return p


class ServerProcess:
    """``with ServerProcess(cmd, env, log) as srv: srv.wait_ready(port, "/health", 300)``."""

    def __init__(self, cmd: list[str], env: dict, log: Path):
        self.cmd, self.env, self.log = cmd, env, log
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> ServerProcess:
        self.proc = spawn(self.cmd, self.env, self.log)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        kill_group(self.proc)

    def wait_ready(self, port: int, path: str, timeout_s: float) -> float:
        """Poll ``http://127.0.0.1:port{path}`` until it answers 200; the seconds since the start.

        Raises RuntimeError (with the tail of the server's log) when the server exits or the
        timeout passes first.
        """
        url = f"http://127.0.0.1:{port}{path}"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} before {path} answered 200: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t0
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - self.t0 > timeout_s:
                raise RuntimeError(f"{url} not 200 after {timeout_s:.0f} s: {self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, n: int = 6) -> str:
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        return " | ".join(lines[-n:])[-800:]


def system_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(root_pid: int) -> float:
    """CPU seconds (user + system) of ``root_pid`` and its live descendants, plus the children they
    have already reaped (cutime/cstime), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            s = (d / "stat").read_text()
        except OSError:
            continue
        f = s.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ... utime(12) stime cutime cstime
        parent[int(d.name)] = int(f[1])
        cpu[int(d.name)] = sum(int(x) for x in f[11:15]) / tick
    total, todo = 0.0, [root_pid]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total
