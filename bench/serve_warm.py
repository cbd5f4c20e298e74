"""Cold start and event-loop stalls of `trtpipe serve`, measured at the client (not CI).

    .venv/bin/python bench/serve_warm.py [--reps 2] [--artifact artifacts/smollm2-135m-cpu/cpu]

Per repetition, interleaved: a server started with the warm-up (the default) and one with
--no-warm-up, each fresh on 127.0.0.1 (--max-request-bytes 12000000). On each:

- the first 20 streamed requests after the ready line, one at a time, then 10 more ("warm"): TTFT
  p50 of the first 20 / p50 of the warm 10 (issue 27 target: <= 1.2x); a cache_salt per request,
  so every one prefills the same ~50-token prompt;
- /health polled every 10 ms for 3 s quiet, then while 3 bodies of 10 MB (a 10 MB prompt) are
  refused: the health latency p50 / max in both phases (target: within 50 ms of unloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from serve_util import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-cpu"
PROMPT = "Describe the water cycle in a few sentences, with one example of each stage. " * 3


def ttft_ms(url: str, salt: str) -> float:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True, "cache_salt": salt, "ignore_eos": True}
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                return (time.monotonic() - t0) * 1e3
    raise RuntimeError("no token")


def health_ms(url: str, seconds: float, during=None) -> list[float]:
    """/health latencies [ms] every 10 ms for ``seconds`` (or while ``during()`` runs)."""
    out: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as h:
            while not stop.is_set():
                t = time.monotonic()
                h.get(url + "/health")
                out.append((time.monotonic() - t) * 1e3)
                time.sleep(0.01)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    if during is None:
        time.sleep(seconds)
    else:
        during()
    stop.set()
    th.join(30)
    return out


def one_server(artifact: Path, warm: bool) -> dict:
    flags = ["--max-request-bytes", "12000000"] + ([] if warm else ["--no-warm-up"])
    with ServerProcess(artifact, *flags, ready_timeout_s=600) as s:
        xs = [ttft_ms(s.url, f"r{i}") for i in range(30)]
        big = json.dumps({"model": MODEL, "prompt": "word " * 2_000_000, "max_tokens": 4}).encode()

        def send_big() -> None:
            with httpx.Client(timeout=60) as h:
                for _ in range(3):
                    r = h.post(s.url + "/v1/completions", content=big, headers={"content-type": "application/json"})
                    assert r.status_code == 400, r.text[:200]

        quiet, busy = health_ms(s.url, 3.0), health_ms(s.url, 0, send_big)
        ready = next(line for line in s.lines if "ready at" in line).strip()
    first, later = statistics.median(xs[:20]), statistics.median(xs[20:])
    return {
        "warm_up": warm,
        "ttft_first_request_ms": round(xs[0]),
        "ttft_p50_first20_ms": round(first),
        "ttft_p50_warm_ms": round(later),
        "cold_ratio": round(first / later, 2),
        "health_quiet_p50_max_ms": [round(statistics.median(quiet), 1), round(max(quiet), 1)],
        "health_10mb_p50_max_ms": [round(statistics.median(busy), 1), round(max(busy), 1)],
        "load_1m": round(os.getloadavg()[0], 2),
        "ready_line": ready[:400],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    a = ap.parse_args()
    for rep in range(a.reps):
        for warm in (rep % 2 == 0, rep % 2 == 1):
            print(json.dumps({"rep": rep, **one_server(Path(a.artifact), warm)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
