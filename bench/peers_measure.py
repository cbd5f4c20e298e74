"""bench/peers.py, the measurement side: run each engine's worker in interleaved rounds, wait for
the shared machine to calm down, keep the clean runs, and take medians.

Interleaving: rounds of ``for engine in round_order(engines, round): run one worker`` (rotated,
reversed every other round, :data:`SETTLE_S` seconds between workers), so machine drift hits all
alike and no engine always runs first or after the same neighbour. A run during which other
processes held more than ``max_foreign_load`` cores is kept in the raw numbers but left out of
the medians.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peers_setup import ENGINES, REPO, PeerEngine, _offline_env, _tail, engine_env, venv_python
from peers_workers import ForeignLoad
from peers_workload import PROMPT_LENGTHS, RESULT_MARK

PEERS_SCRIPT = Path(__file__).resolve().with_name("peers.py")


def python_for(spec: PeerEngine) -> str:
    return sys.executable if spec.venv == "main" else str(venv_python(spec.venv))


def run_worker(engine: str, spec_file: Path, timeout_s: float) -> dict:
    cmd = [python_for(ENGINES[engine]), str(PEERS_SCRIPT), "--worker", engine, "--spec", str(spec_file)]
    env = engine_env(ENGINES[engine], int(json.loads(spec_file.read_text())["threads"]))
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            r = json.loads(line[len(RESULT_MARK) :])
            r["worker_wall_s"] = time.monotonic() - t
            return r
    return {"error": f"worker exit {p.returncode}: {_tail(p.stderr or p.stdout)}"}


def run_profile(artifact: Path, threads: int, timeout_s: float = 300) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "profile_decode.py"),
        "--artifact",
        str(artifact),
        "--threads",
        str(threads),
        "--json",
    ]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_offline_env(), cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"error": f"profile_decode.py timed out after {timeout_s:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    return {"error": f"profile_decode.py exit {p.returncode}: {_tail(p.stderr or p.stdout)}"}


def wait_quiet(max_wait_s: float, below_cores: float) -> float | None:
    """Wait (up to ``max_wait_s``) until other processes use less than ``below_cores`` over a 3 s
    sample; returns the last sample."""
    t = time.monotonic()
    while True:
        probe = ForeignLoad()
        time.sleep(3)
        load = probe.cores()
        if load is None or load < below_cores or time.monotonic() - t >= max_wait_s:
            break
    if time.monotonic() - t > 4:
        print(f"  (waited {time.monotonic() - t:.0f} s for other jobs; foreign load now {load:.2f} cores)", flush=True)
    return load


def _is_clean(r: dict, max_foreign_load: float) -> bool:
    fl = r.get("foreign_load_cores")
    return "error" not in r and (fl is None or fl <= max_foreign_load)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict[str, list[dict]], max_foreign_load: float = math.inf) -> dict:
    """Medians per engine over its clean runs (other processes used <= ``max_foreign_load`` cores
    meanwhile); over all its runs, flagged ``contended``, if none was clean."""
    out = {}
    for e, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out[e] = {"error": rs[0]["error"] if rs else "not run"}
            continue
        clean = [r for r in ok if _is_clean(r, max_foreign_load)]
        contended = not clean
        ok = clean or ok
        out[e] = {
            "repeats": len(ok),
            "runs": len(rs),
            "contended": contended,
            "ttft_s": {n: median([r["ttft_s"][str(n)] for r in ok]) for n in PROMPT_LENGTHS},
            "tpot_s": {n: median([r["tpot_s"][str(n)] for r in ok]) for n in PROMPT_LENGTHS},
            "tps": median([r["concurrent"]["output_tokens_per_s"] for r in ok]),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ok),
            "load_s": median([r["load_s"] for r in ok]),
            "versions": ok[0]["versions"],
            "extra": ok[-1].get("extra", {}),
            "first_output_ids": ok[0]["first_output_ids"],
            "errors": [r["error"] for r in rs if "error" in r],
            "spread": _spread(ok),
        }
    return out


def _spread(runs: list[dict]) -> float | None:
    """Max / min of the TPOT over ``runs``, at the prompt length where it is widest (None with
    fewer than two runs): the run-to-run stability of an engine (issue 13)."""
    if len(runs) < 2:
        return None
    return max(max(r["tpot_s"][str(n)] for r in runs) / min(r["tpot_s"][str(n)] for r in runs) for n in PROMPT_LENGTHS)


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        kv = dict((k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in lscpu.splitlines() if ":" in ln))
        flags = set(kv.get("Flags", "").split())
        info.update(
            cpu=kv.get("Model name"),
            cpus=kv.get("CPU(s)"),
            cpu_family=kv.get("CPU family"),
            cpu_model=kv.get("Model"),
            hypervisor=kv.get("Hypervisor vendor"),
            simd=" ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16") if f in flags),
        )
    except OSError:
        pass
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                info["mem_gib"] = round(int(ln.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def _print_run(r: int, e: str, res: dict, max_foreign_load: float) -> None:
    if "error" in res:
        print(f"[round {r + 1}] {e}: ERROR {res['error']}", flush=True)
        return
    ms = lambda x: f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"  # noqa: E731
    fl = res.get("foreign_load_cores")
    print(
        f"[round {r + 1}] {e:18s} TTFT "
        + "/".join(ms(res["ttft_s"][str(n)]) for n in PROMPT_LENGTHS)
        + " ms  TPOT "
        + "/".join(ms(res["tpot_s"][str(n)]) for n in PROMPT_LENGTHS)
        + f" ms  x8 {res['concurrent']['output_tokens_per_s']:.0f} tok/s"
        + f"  ({res['worker_wall_s']:.0f} s, foreign load {fl if fl is None else round(fl, 2)}"
        + f"{'' if _is_clean(res, max_foreign_load) else ': left out'})",
        flush=True,
    )


# Seconds between two workers: the previous one's teardown (transformers' ~1 GB) is not charged
# to the next. Measured 2026-12-01 on a Zen 3: trtpipe's TPOT at 512 tokens was 23-31 ms in the
# four runs that started right after transformers-fp32 and 19-22 ms in the two that ran first.
SETTLE_S = 5.0


def round_order(engines: list[str], r: int) -> list[str]:
    """Round ``r``'s order: the engines rotated by ``r``, reversed in odd rounds, so every engine
    runs first as often as the others and follows its neighbour on either side in turn (a plain
    rotation kept the same predecessor for every engine in every round)."""
    k = r % max(1, len(engines))
    order = engines[k:] + engines[:k]
    return order[::-1] if r % 2 else order


def run_rounds(
    runnable: list[str],
    runs: dict[str, list[dict]],
    spec_file: Path,
    *,
    repeats: int,
    max_rounds: int,
    max_minutes: float,
    max_foreign_load: float,
    wait_quiet_s: float,
    worker_timeout_s: float,
) -> int:
    """Interleaved rounds until every engine in ``runnable`` has ``repeats`` clean runs, or
    ``max_rounds``, or another round would pass ``max_minutes``; appends to ``runs``. Returns the
    number of rounds run."""
    r, t_round, t_measure = 0, 0.0, time.monotonic()  # the budget excludes any setup time
    while r < max_rounds:
        clean = [
            sum(1 for x in runs[e] if _is_clean(x, max_foreign_load))
            for e in runnable
            if not all("error" in x for x in runs[e])
        ]
        if clean and min(clean) >= repeats:
            break
        if r > 0 and time.monotonic() - t_measure + t_round > max_minutes * 60:
            print(f"stopping after {r} rounds: another would pass --max-minutes {max_minutes:g}", flush=True)
            break
        t0_round = time.monotonic()
        wait_quiet(wait_quiet_s, max_foreign_load)
        for i, e in enumerate(round_order(runnable, r)):
            if runs[e] and all("error" in x for x in runs[e]):
                continue  # failed on its first try: do not spend more time on it
            if i:
                time.sleep(SETTLE_S)
            res = run_worker(e, spec_file, worker_timeout_s)
            res["round"], res["position"] = r, i
            runs[e].append(res)
            _print_run(r, e, res, max_foreign_load)
        t_round = time.monotonic() - t0_round
        r += 1
    return r
