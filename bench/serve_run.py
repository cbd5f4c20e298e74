"""bench/serve.py, one aiperf run against one freshly started server: start it on a free port of
127.0.0.1, wait until it answers, drive it with ``aiperf profile``, stop both, and account the CPU the
server, the client and other processes used meanwhile.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import serve_report
from serve_commands import aiperf_command, aiperf_env, eos_suppression, served_model_id, server_command, server_env
from serve_proc import ServerProcess, free_port, kill_group, process_tree_cpu_s, spawn, system_busy_s


def one_run(engine: str, load: dict, args, work: Path, tag: str) -> dict:
    """Start the server, drive it with aiperf, stop it; the aiperf summary plus CPU accounting."""
    port = free_port()
    cmd, ready_path = server_command(engine, port, args)
    out_dir = work / tag
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {"engine": engine, "load": load, "server_cmd": cmd, "when": time.strftime("%H:%M:%S", time.gmtime())}
    with ServerProcess(cmd, server_env(args.threads), out_dir / "server.log") as srv:
        try:
            res["server_load_s"] = round(srv.wait_ready(port, ready_path, args.load_timeout), 2)
            url = f"http://127.0.0.1:{port}"
            model = served_model_id(url)
        except RuntimeError as e:
            return res | {"error": str(e)}
        acmd = aiperf_command(url, model, load, args, out_dir, eos_suppression(engine))
        res["aiperf_cmd"] = acmd
        busy0, srv0, self0 = system_busy_s(), process_tree_cpu_s(srv.pid), _children_cpu_s()
        t0 = time.monotonic()
        timeout = (args.duration or 600) + 30 + 300  # + aiperf's grace period, start-up and warm-up
        p = spawn(acmd, aiperf_env(), out_dir / "aiperf.log", cwd=out_dir)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_group(p)
        wall = time.monotonic() - t0
        srv_cpu = process_tree_cpu_s(srv.pid) - srv0
        client_cpu = _children_cpu_s() - self0
        busy = system_busy_s() - busy0
    res.update(
        wall_s=round(wall, 1),
        server_cpu_cores=round(srv_cpu / wall, 2),
        client_cpu_cores=round(client_cpu / wall, 2),
        foreign_load_cores=round(max(0.0, busy - srv_cpu - client_cpu) / wall, 2),
    )
    if rc is None:
        return res | {"error": f"aiperf did not finish in {timeout:.0f} s (log: {out_dir / 'aiperf.log'})"}
    summary = serve_report.read_aiperf_summary(out_dir)
    if summary is None:
        return res | {"error": f"aiperf exit {rc}, no profile_export_aiperf.json: {_aiperf_error(out_dir)}"}
    return res | {"metrics": summary}


def _aiperf_error(out_dir: Path) -> str:
    """aiperf's first logged ERROR line (its console output is a box drawing), else its output's tail."""
    for log in (out_dir / "logs" / "aiperf.log", out_dir / "aiperf.log"):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        errs = [ln.split(" - ERROR - ", 1)[1] for ln in lines if " - ERROR - " in ln]
        if errs:
            return errs[0][:600] + f" (log: {log})"
    return " | ".join(ln.strip() for ln in lines[-5:])[-600:] if lines else "(no log)"


def _children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
