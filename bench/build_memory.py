"""Peak RSS of a command (e.g. ``trtpipe build``) between its log lines: where a build's memory goes.

Runs the command as a child, samples the resident set of its whole process tree (psutil, every
``--interval-s``) and time-stamps each line it prints, so each line gets the peak RSS reached
since the line before it (a build's lines mark the ends of its stages: "loaded ...",
"exported ...", "golden ...", "native engine: ..."). ``--kill-above-gb`` ends the tree when its
RSS passes a limit (a shared machine), and says so. Prints a table; ``--json F`` writes it.

    python bench/build_memory.py --kill-above-gb 6 -- trtpipe build recipes/X.yaml --artifacts /tmp/a
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of ``proc`` and its descendants (0 for those that have exited)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--kill-above-gb", type=float, default=0.0, help="0: never")
    ap.add_argument("--json", type=Path)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    proc = psutil.Process(child.pid)
    state = {"peak": 0, "since_line": 0, "last": 0, "killed": False}
    lines: list[dict] = []

    def sample() -> None:
        while child.poll() is None:
            rss = tree_rss(proc)
            state["last"] = rss
            state["peak"] = max(state["peak"], rss)
            state["since_line"] = max(state["since_line"], rss)
            if args.kill_above_gb and rss > args.kill_above_gb * 1e9 and not state["killed"]:
                state["killed"] = True
                print(f"[build_memory] RSS {rss / 1e9:.2f} GB > {args.kill_above_gb} GB: killing", flush=True)
                for p in [*proc.children(recursive=True), proc]:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
            time.sleep(args.interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert child.stdout is not None
    for line in child.stdout:
        t, peak = time.perf_counter() - t0, state["since_line"] / 1e9
        state["since_line"] = state["last"]  # the next line's peak starts from the current RSS
        lines.append({"t_s": round(t, 1), "peak_since_previous_gb": round(peak, 3), "line": line.rstrip()})
        print(f"{t:8.1f} s {peak:7.2f} GB | {line.rstrip()}", flush=True)
    rc = child.wait()
    sampler.join()
    total = time.perf_counter() - t0
    print(f"exit {rc}; wall {total:.1f} s; peak RSS {state['peak'] / 1e9:.2f} GB (process tree, sampled every "
          f"{args.interval_s} s){'; KILLED at the limit' if state['killed'] else ''}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"command": cmd, "exit": rc, "wall_s": total, "peak_rss_bytes": state["peak"],
                                         "killed": state["killed"], "lines": lines}, indent=1))  # fmt: skip
    return rc


if __name__ == "__main__":
    sys.exit(main())
