"""`trtpipe serve` warm before ready, and no request that stalls the others (real model, one live
server on 127.0.0.1, bounded in count and time):

- the ready line says how long the warm-up took, and the first request after it has a TTFT
  within WARM_TTFT_RATIO of the next ones' (issue 27 measured 4.4x cold);
- a body over --max-request-bytes gets 413 before parsing; a body just under it, and a 10 MB one
  (the limit raised), get 400 from the byte bound applied before tokenizing; meanwhile /health,
  polled every 10 ms, and concurrent 16-token requests answer within STALL_BOUND_MS of their
  unloaded latency (/health: its slowest answer; the requests: their median). What remains on the event loop is json.loads of the body (~1.5 ms per MB on
  a quiet 2-core host); on a busy host the bound is scaled by how much slower that parse runs now
  than JSON_PARSE_REF_MS.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import pytest
from serve_util import ServerProcess

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")

MODEL = "smollm2-135m-cpu"
LIMIT_BYTES = 12_000_000  # raised from the default 4 MiB, so a 10 MB body passes the body limit
WARM_TTFT_RATIO = 2.0  # the target is 1.2x (a bench figure, bench/serve_warm.py); cold measured 4-11x here
STALL_BOUND_MS = 50.0
JSON_PARSE_REF_MS = 20.0  # json.loads of the 10 MB body below on a quiet 2-core Zen 4 host: 12-18 ms


@pytest.fixture(scope="module")
def server(default_artifact):
    with ServerProcess(default_artifact, "--max-request-bytes", str(LIMIT_BYTES), "--max-queue-wait-ms", "2000") as s:
        yield s


def _ttft_s(url: str, prompt: str, salt: str) -> float:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": True, "cache_salt": salt, "ignore_eos": True}
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                return time.monotonic() - t0
    raise AssertionError("no token")


def test_warm_before_ready_first_request_ttft(server):
    ready = next(line for line in server.lines if "ready at" in line)
    assert "warmed up in" in ready and "decode batches 1-8" in ready
    assert server.health_while_loading in (None, 503)
    prompt = "Describe the water cycle in a few sentences, with one example of each stage. " * 3
    # distinct salts: no request reuses another's KV, so each prefills the same ~50 tokens
    first = _ttft_s(server.url, prompt, "first")
    warm = statistics.median(_ttft_s(server.url, prompt, f"warm{i}") for i in range(5))
    assert first <= WARM_TTFT_RATIO * warm + 0.05, (first, warm)


class _Poller:
    """Latencies of GET /health every 10 ms and of 16-token completions back to back (seconds)."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.health: list[float] = []
        self.short: list[float] = []
        self.errors: list[str] = []  # answers other than 200 (a thread never dies on one)

    def run(self) -> _Poller:
        def health() -> None:
            with httpx.Client(timeout=30) as h:
                while not self.stop.is_set():
                    t = time.monotonic()
                    r = h.get(self.url + "/health")
                    self.health.append(time.monotonic() - t)
                    if r.status_code != 200:
                        self.errors.append(f"/health {r.status_code} {r.text[:200]}")
                    time.sleep(0.01)

        def short() -> None:
            body = {"model": MODEL, "prompt": "Count to five:", "max_tokens": 16, "ignore_eos": True}
            with httpx.Client(timeout=60) as h:
                while not self.stop.is_set():
                    t = time.monotonic()
                    r = h.post(self.url + "/v1/completions", json=body)
                    self.short.append(time.monotonic() - t)
                    if r.status_code != 200:
                        self.errors.append(f"completion {r.status_code} {r.text[:200]}")

        self.threads = [threading.Thread(target=f, daemon=True) for f in (health, short)]
        for th in self.threads:
            th.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=60)


def _measure(url: str, during) -> tuple[_Poller, list]:
    p = _Poller(url).run()
    time.sleep(2.0)
    answers = during()
    time.sleep(2.0)
    p.join()
    return p, answers


def test_body_limit_and_byte_bound_do_not_stall_the_server(server):
    url = server.url
    base, _ = _measure(url, lambda: [])
    just_under = b'{"model": "%s", "max_tokens": 4, "prompt": "' % MODEL.encode()
    just_under += b"a" * (LIMIT_BYTES - len(just_under) - 2) + b'"}'
    ten_mb = json.dumps({"model": MODEL, "prompt": "word " * 2_000_000, "max_tokens": 4}).encode()
    over = b" " * (LIMIT_BYTES + 1)

    def big_bodies() -> list:
        out = []
        with httpx.Client(timeout=60) as h:
            for body in (just_under, ten_mb, over, just_under):
                r = h.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
                out.append((len(body), r.status_code, r.json()["error"]))
        return out

    t = time.perf_counter()
    json.loads(ten_mb.decode())
    slowdown = max(1.0, (time.perf_counter() - t) * 1e3 / JSON_PARSE_REF_MS)
    loaded, answers = _measure(url, big_bodies)
    if max(loaded.health) * 1e3 > max(base.health) * 1e3 + STALL_BOUND_MS * slowdown:
        # once more: a stall the server causes (10 MB tokenized on the event loop: seconds) comes
        # back every time; one slow answer from the shared host's scheduler does not
        loaded, answers = _measure(url, big_bodies)
    assert [a[1] for a in answers] == [400, 400, 413, 400]
    bound = answers[0][2]
    assert bound["code"] == "context_length_exceeded" and "refused before tokenizing" in bound["message"]
    assert answers[2][2]["code"] == "request_too_large" and "--max-request-bytes" in answers[2][2]["message"]
    assert not base.errors and not loaded.errors, base.errors + loaded.errors
    # /health: its slowest answer (a stall shows there); the 16-token request, ~1 s on a busy host and
    # noisier than the bound itself: its median over the phase
    quiet_ms, busy_ms = max(base.health) * 1e3, max(loaded.health) * 1e3
    assert busy_ms <= quiet_ms + STALL_BOUND_MS * slowdown, ("health", quiet_ms, busy_ms, slowdown)
    # The 16-token request shares the 2 cores with this client's own sending of 12 MB bodies and the
    # server's reading of them, so it gets half its own latency on top of the bound; a stall (10 MB
    # tokenized on the event loop: seconds) would still exceed that many times over.
    quiet_ms, busy_ms = statistics.median(base.short) * 1e3, statistics.median(loaded.short) * 1e3
    bound_ms = STALL_BOUND_MS * slowdown + 0.5 * quiet_ms
    assert busy_ms <= quiet_ms + bound_ms, ("16-token request", quiet_ms, busy_ms, slowdown)


def test_overloaded_request_gets_503_with_retry_after(server):
    """8 running requests that ignore EOS with 1000 tokens to go fill the batch: a 9th would wait
    ~1000 decode steps for a row, past this server's 2 s limit: 503 overloaded + Retry-After, and
    the server serves again once they are gone."""
    import contextlib

    body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 1000, "ignore_eos": True, "stream": True}

    def admitted(stack: contextlib.ExitStack, h: httpx.Client) -> httpx.Response:
        # on a loaded host the slo policy's host factor can predict > 2 s of prefill for the few
        # requests still in the channel: retry as a client told Retry-After does (bounded)
        for _ in range(10):
            r = stack.enter_context(h.stream("POST", server.url + "/v1/completions", json=body))
            if r.status_code != 503:
                return r
            time.sleep(float(r.headers["retry-after"]))
        raise AssertionError("one of the 8 requests was refused 10 times")

    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(timeout=60)) for _ in range(8)]
        streams = [admitted(stack, h) for h in clients]
        assert [s.status_code for s in streams] == [200] * 8
        lines = [s.iter_lines() for s in streams]  # kept: a dropped iterator closes its connection
        for it in lines:  # the first chunk of each: all 8 run
            while not next(it).startswith("data: "):
                pass
        r = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
        assert int(r.headers["retry-after"]) >= 1 and "--max-queue-wait-ms 2000" in r.json()["error"]["message"]
    deadline = time.monotonic() + 30  # the 8 disconnects reach the engine thread
    while server.metrics()["trtpipe:num_requests_running"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    ok = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 2, "stream": False}, timeout=60)
    assert ok.status_code == 200
    assert server.metrics()['trtpipe:requests_rejected_total{reason="overloaded"}'] >= 1
