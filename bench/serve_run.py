"""bench/serve.py, one server session: start the server on a free port of 127.0.0.1, wait until it
answers, drive it with each client in turn (one run each), stop it; per run the per-request records
(bench/serve_clients.py), the figures (bench/serve_goodput.py) and the CPU the server, the client
and other processes used meanwhile.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import serve_clients
from serve_commands import served_model_id, server_command, server_env
from serve_goodput import run_figures
from serve_proc import ServerProcess, free_port, kill_group, process_tree_cpu_s, spawn, system_busy_s


def server_session(engine: str, clients: list[str], load: dict, args, work: Path, tag: str) -> list[dict]:
    """One fresh server, one run per client (in the order given); a run dict per client."""
    port = free_port()
    cmd, ready_path = server_command(engine, port, args)
    base = {"engine": engine, "load": load, "server_cmd": cmd}
    work.mkdir(parents=True, exist_ok=True)
    with ServerProcess(cmd, server_env(engine, args.threads), work / f"{tag}-{engine}-server.log") as srv:
        try:
            load_s = round(srv.wait_ready(port, ready_path, args.load_timeout), 2)
            url = f"http://127.0.0.1:{port}"
            model = served_model_id(url)
        except (RuntimeError, OSError) as e:
            return [base | {"client": c, "error": f"server did not start: {e}"} for c in clients]
        runs = []
        for c in clients:
            out_dir = work / f"{tag}-{engine}-{c}"
            r = base | {"client": c, "server_load_s": load_s, "when": time.strftime("%H:%M:%S", time.gmtime())}
            runs.append(r | one_client_run(c, url, model, load, args, out_dir, srv.pid))
        return runs


def _client_command(client: str, url: str, model: str, load: dict, args, out_dir: Path) -> list[str]:
    if client == "aiperf":
        exe = args.aiperf_venv / "bin" / "aiperf"
        return serve_clients.aiperf_command(exe, url, model, load, args.tokenizer_dir, out_dir, args.warmup_requests)
    return serve_clients.vllm_bench_command(
        args.vllm_python, url, model, load, args.tokenizer_dir, out_dir, args.warmup_requests
    )


def one_client_run(client: str, url: str, model: str, load: dict, args, out_dir: Path, server_pid: int) -> dict:
    """Drive the server at ``url`` with ``client``; the figures plus CPU accounting, or an error."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = _client_command(client, url, model, load, args, out_dir)
    busy0, srv0, self0 = system_busy_s(), process_tree_cpu_s(server_pid), _children_cpu_s()
    t0 = time.monotonic()
    p = spawn(cmd, serve_clients.client_env(client), out_dir / "client.log", cwd=out_dir)
    try:
        rc = p.wait(timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        kill_group(p)
    wall = time.monotonic() - t0
    srv_cpu, client_cpu = process_tree_cpu_s(server_pid) - srv0, _children_cpu_s() - self0
    res = {
        "client_cmd": cmd,
        "wall_s": round(wall, 1),
        "server_cpu_cores": round(srv_cpu / wall, 2),
        "client_cpu_cores": round(client_cpu / wall, 2),
        "foreign_load_cores": round(max(0.0, system_busy_s() - busy0 - srv_cpu - client_cpu) / wall, 2),
    }
    if rc is None:
        return res | {"error": f"{client} did not finish in {args.run_timeout:.0f} s (log: {out_dir / 'client.log'})"}
    try:
        parse = serve_clients.aiperf_records if client == "aiperf" else serve_clients.vllm_bench_records
        records, duration = parse(out_dir)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        return res | {"error": f"{client} exit {rc}, no per-request results ({e}): {_log_tail(out_dir / 'client.log')}"}
    sent = load["count"]
    figures = run_figures(records, max(sent, len(records)), duration or wall)
    errors = sorted({r["error"] for r in records if r.get("error")})[:3]
    return res | {"figures": figures, "client_rc": rc, "error_examples": errors}


def _log_tail(log: Path, n: int = 5) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    errs = [ln for ln in lines if "error" in ln.lower()]
    return " | ".join((errs or lines)[-n:])[-600:]


def _children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
