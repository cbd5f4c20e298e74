"""Soak `trtpipe serve` (not CI): N minutes of Poisson traffic at a fraction of its capacity, with
random client disconnects and malformed requests; prints and writes what should not drift.

    .venv/bin/python bench/soak.py [--minutes 30] [--load 0.7] [--disconnect 0.2] [--malformed 0.05]
                                   [--artifact artifacts/smollm2-135m-cpu/cpu] [--capacity-rps R]
                                   [--json soak.json]

1. Starts `trtpipe serve ARTIFACT` (defaults: derived budgets, admission, warm-up) on 127.0.0.1.
2. Capacity: unless --capacity-rps, a closed loop of max_batch_size clients for --probe-s seconds
   (completed requests per second).
3. Poisson arrivals at --load x capacity for --minutes: completions streamed with 64-256-token
   prompts (random windows of a fixed text) and 32-64 output tokens (ignore_eos); a --disconnect
   fraction closes its stream after 0-8 chunks; a --malformed fraction sends a bad body (negative
   max_tokens, temperature 5, invalid JSON, unknown model), which must get a 400.
4. Reports: server RSS at the start of the traffic and at the end (growth %), KV blocks in use
   after the traffic (trtpipe:kv_blocks_in_use), HTTP status counts (5xx must be 0, 503s are
   listed apart), and TTFT / ITL p50 and p95 of the completed requests in the first and the last
   window (5 minutes, or a quarter of a shorter run): their drift in %.

Targets (issue 27): RSS growth < 5 %, 0 KV blocks left, 0 5xx, p95 drift < 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from serve_util import ServerProcess, read_metrics  # noqa: E402

MODEL = "smollm2-135m-cpu"
TEXT = (
    "The river rose slowly through the spring, carrying silt from the hills to the plain, where farmers "
    "had learned over centuries to read its moods. Each village kept records of the floods, the harvests "
    "and the markets, and the oldest of these ledgers describe a trade in salt, wool and copper that "
    "reached far beyond the mountains. "
) * 40
MALFORMED = (
    {"model": MODEL, "prompt": "hi", "max_tokens": -3},
    {"model": MODEL, "prompt": "hi", "temperature": 5},
    {"model": "no-such-model", "prompt": "hi"},
    None,  # invalid JSON
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity")
    ap.add_argument("--disconnect", type=float, default=0.2)
    ap.add_argument("--malformed", type=float, default=0.05)
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    ap.add_argument("--capacity-rps", type=float, default=None, help="skip the probe, use this capacity")
    ap.add_argument("--probe-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", dest="json_out", default=None)
    return ap


class Traffic:
    """One soak client: sends requests, records what came back."""

    def __init__(self, url: str, rng: random.Random, tokens_of_text: list[str]) -> None:
        self.url, self.rng, self.words = url, rng, tokens_of_text
        self.status: dict[str, int] = {}
        self.done: list[tuple[float, float, list[float]]] = []  # (sent_s, ttft_s, gaps_s) of completed requests

    def body(self) -> dict:
        n = self.rng.randint(48, 190)  # words: ~64-256 tokens of this text
        start = self.rng.randrange(0, len(self.words) - n)
        prompt = " ".join(self.words[start : start + n])
        return {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": self.rng.randint(32, 64),
            "ignore_eos": True,
            "stream": True,
            "temperature": self.rng.choice([0, 0.8]),
        }

    def count(self, key: str) -> None:
        self.status[key] = self.status.get(key, 0) + 1

    async def malformed(self, h: httpx.AsyncClient) -> None:
        bad = self.rng.choice(MALFORMED)
        content = b'{"model": "' if bad is None else json.dumps(bad).encode()
        r = await h.post(self.url + "/v1/completions", content=content, headers={"content-type": "application/json"})
        self.count(f"malformed {r.status_code}")

    async def one(self, h: httpx.AsyncClient, t0: float) -> None:
        if self.rng.random() < MALFORMED_FRACTION:
            return await self.malformed(h)
        cut = self.rng.randint(0, 8) if self.rng.random() < DISCONNECT_FRACTION else None
        sent = time.monotonic()
        times: list[float] = []
        async with h.stream("POST", self.url + "/v1/completions", json=self.body()) as r:
            self.count(str(r.status_code))
            if r.status_code != 200:
                await r.aread()
                return
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                    if cut is not None and len(times) > cut:
                        self.count("disconnected")
                        return  # leaving the block closes the connection
        if times:
            self.done.append((sent - t0, times[0] - sent, [b - a for a, b in zip(times, times[1:])]))


DISCONNECT_FRACTION = 0.2
MALFORMED_FRACTION = 0.05


async def closed_loop_rps(url: str, clients: int, seconds: float, rng: random.Random, words: list[str]) -> float:
    """Completed requests per second of ``clients`` back-to-back clients (the capacity probe)."""
    t = Traffic(url, rng, words)
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=600) as h:

        async def client() -> None:
            while time.monotonic() < end:
                await t.one(h, 0.0)

        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        return len(t.done) / (time.monotonic() - t0)


async def poisson(url: str, rate: float, seconds: float, rng: random.Random, words: list[str]) -> Traffic:
    """Open-loop Poisson arrivals at ``rate`` for ``seconds``; waits for the stragglers."""
    t = Traffic(url, rng, words)
    tasks = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as h:
        t0 = time.monotonic()
        at = 0.0
        while at < seconds:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(t.one(h, t0)))
        await asyncio.gather(*tasks, return_exceptions=True)
    return t


def window_stats(done: list, lo: float, hi: float) -> dict:
    """TTFT and ITL p50/p95 [ms] of the completed requests sent in [lo, hi) seconds."""
    rows = [d for d in done if lo <= d[0] < hi]
    ttft = [d[1] * 1e3 for d in rows]
    itl = [g * 1e3 for d in rows for g in d[2]]

    def pct(xs: list, q: int) -> float | None:
        return round(float(np.percentile(xs, q)), 1) if xs else None

    return {
        "requests": len(rows),
        **{f"{n}_p{q}_ms": pct(xs, q) for n, xs in (("ttft", ttft), ("itl", itl)) for q in (50, 95)},
    }


def drift(first: dict, last: dict) -> dict:
    """(last - first) / first per p95 metric, in %."""
    return {
        k: None if not first.get(k) or last.get(k) is None else round(100 * (last[k] - first[k]) / first[k], 1)
        for k in ("ttft_p95_ms", "itl_p95_ms")
    }


def main() -> int:
    global DISCONNECT_FRACTION, MALFORMED_FRACTION
    a = _parser().parse_args()
    DISCONNECT_FRACTION, MALFORMED_FRACTION = a.disconnect, a.malformed
    rng = random.Random(a.seed)
    words = TEXT.split()
    seconds = a.minutes * 60
    with ServerProcess(Path(a.artifact), ready_timeout_s=600) as server:
        print("".join(line for line in server.lines if "ready at" in line or "prefill chunks" in line), end="")
        proc = psutil.Process(server.pid)
        manifest = json.loads((Path(a.artifact) / "manifest.json").read_text())
        clients = int(manifest.get("limits", {}).get("max_batch_size", 8))
        capacity = a.capacity_rps or asyncio.run(closed_loop_rps(server.url, clients, a.probe_s, rng, words))
        rate = a.load * capacity
        print(
            f"capacity {capacity:.2f} req/s ({clients} clients back to back); soak at {rate:.2f} req/s for {a.minutes:g} min"
        )
        rss0 = proc.memory_info().rss
        load0 = os.getloadavg()
        t = asyncio.run(poisson(server.url, rate, seconds, rng, words))
        time.sleep(1.0)
        rss1 = proc.memory_info().rss
        metrics = read_metrics(httpx.get(server.url + "/metrics", timeout=30).text)
    window = min(300.0, seconds / 4)
    first, last = window_stats(t.done, 0, window), window_stats(t.done, seconds - window, seconds)
    out = {
        "minutes": a.minutes,
        "capacity_rps": round(capacity, 3),
        "rate_rps": round(rate, 3),
        "rss_mib_start_end": [round(rss0 / 2**20, 1), round(rss1 / 2**20, 1)],
        "rss_growth_pct": round(100 * (rss1 - rss0) / rss0, 2),
        "kv_blocks_in_use_at_end": metrics.get("trtpipe:kv_blocks_in_use"),
        "status_counts": dict(sorted(t.status.items())),
        "num_5xx": sum(v for k, v in t.status.items() if k[-3:].startswith("5")),
        "window_s": window,
        "first_window": first,
        "last_window": last,
        "p95_drift_pct": drift(first, last),
        "load_avg_1m_start_end": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "host": " ".join(os.uname()[1:3]),
    }
    print(json.dumps(out, indent=2))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
