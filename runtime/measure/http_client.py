"""``trtpipe validate --url``: run a workload against a server over streaming HTTP and time it at
the client, as the user sees it.

Each :class:`~trtpipe.runtime.measure.workload.WorkItem` becomes one streamed ``POST /v1/completions``
(prompt as token ids, greedy, ``max_tokens`` = its output length, ``ignore_eos``,
``return_token_ids``). Timing, with :class:`~trtpipe.runtime.metrics.request_metrics.RequestTimer` on the client's
monotonic clock (so the definitions are those of ``runtime/metrics/request_metrics.py``)::

    arrival = the moment the request is sent (open loop: its scheduled time, so a late send is
              queueing too, as in-process)
    first token = arrival of the first chunk with non-empty text
    later tokens = arrival of each later chunk with text; a chunk carrying k token ids records
              k tokens at its arrival (zero gaps, as the client observes them); ids whose text the
              detokenizer held back are counted with the next chunk that shows text

A 503 (the server refused admission) is retried after its ``Retry-After`` (MAX_BUSY_RETRIES);
the wait counts in the request's TTFT. TPOT and ITL include the network, the HTTP stack and SSE framing: the difference to the
in-process figures is the server's overhead. After the run, ``/metrics``'s ``kv_blocks_in_use``
must come back to 0 (the leak check), and the server's own split of the first token's path
(``trtpipe:first_token_path_seconds``, read before and after: the mean per stage) is kept
beside the client's TTFT; the server's memory is not visible from here (peak RSS None).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence

import httpx

from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.measure.workload import WorkItem
from trtpipe.runtime.metrics.request_metrics import RequestMetrics, RequestTimer, StepStats
from trtpipe.runtime.serve.first_token_path import mean_ms_between, read_first_token_path

# A 503 (the server's admission refused: predicted queue wait or queue length) is retried after
# its Retry-After, at most this often; the request's arrival stays the first send, so the wait
# counts in its TTFT, as a user who retries sees it.
MAX_BUSY_RETRIES = 20
MAX_RETRY_AFTER_S = 5.0


class HttpWorkloadError(TrtpipeError):
    """The server refused or failed a request of the workload (status and body in the message)."""


class HttpTokenizer:
    """``encode`` through the server's ``POST /tokenize`` (so ``make_workload`` needs no local
    artifact)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self._url, self._headers = url.rstrip("/"), headers

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        r = httpx.post(
            self._url + "/tokenize",
            json={"prompt": text, "add_special_tokens": add_special_tokens},
            headers=self._headers,
            timeout=60,
        )
        if r.status_code != 200:
            raise HttpWorkloadError(f"POST {self._url}/tokenize: HTTP {r.status_code} {r.text[:200]}")
        return list(r.json()["tokens"])


async def _one(h: httpx.AsyncClient, url: str, model: str, it: WorkItem, arrival: float, rid: str) -> RequestMetrics:
    body = {
        "model": model,
        "prompt": list(it.prompt_ids),
        "max_tokens": it.max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    if it.cache_salt is not None:
        body["cache_salt"] = it.cache_salt
    timer = RequestTimer(rid, prompt_tokens=len(it.prompt_ids), arrival_s=arrival)
    pending = 0  # token ids received whose text was not shown yet
    reason = None
    for attempt in range(MAX_BUSY_RETRIES + 1):
        async with h.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code == 503 and attempt < MAX_BUSY_RETRIES:  # overloaded: wait as told, the clock runs
                retry_s = float(r.headers.get("retry-after", "1") or 1)
                await asyncio.sleep(min(retry_s, MAX_RETRY_AFTER_S))
                continue
            if r.status_code != 200:
                raise HttpWorkloadError(
                    f"POST {url}/v1/completions: HTTP {r.status_code} {(await r.aread()).decode('utf-8', 'replace')[:300]}"
                )
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    raise HttpWorkloadError(f"stream error from {url}: {doc['error'].get('message')}")
                choice = doc["choices"][0]
                pending += len(choice.get("token_ids") or ())
                reason = choice.get("finish_reason") or reason
                if choice.get("text") and pending:
                    timer.on_tokens(time.monotonic(), pending)
                    pending = 0
            break
    if pending:
        timer.on_tokens(time.monotonic(), pending)
    timer.finish(time.monotonic(), reason)
    return timer.metrics()


async def _run(
    url: str,
    model: str,
    items: Sequence[WorkItem],
    concurrency: int | None,
    headers: dict[str, str],
    on_request_done: Callable[[int, int], None] | None,
) -> tuple[list[RequestMetrics], float, dict[str, tuple[float, int]]]:
    """Measured requests' metrics, wall seconds, and the server's first-token stages read after the
    warm-up (so the run's means leave the warm-up out)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30), headers=headers, limits=limits) as h:
        warm = [it for it in items if it.warmup]
        measured = [it for it in items if not it.warmup]
        sem = asyncio.Semaphore(concurrency or max(1, len(warm)))

        async def warm_one(it: WorkItem) -> None:
            async with sem:
                await _one(h, url, model, it, time.monotonic(), "warmup")

        await asyncio.gather(*(warm_one(it) for it in warm))
        before = read_first_token_path((await h.get(url + "/metrics")).text)
        results: list[RequestMetrics | None] = [None] * len(measured)
        done = 0
        t0 = time.monotonic()

        async def measured_one(i: int) -> None:
            nonlocal done
            it = measured[i]
            if concurrency is None:  # open loop: send at the scheduled arrival
                await asyncio.sleep(max(0.0, t0 + it.arrival_s - time.monotonic()))
                results[i] = await _one(h, url, model, it, t0 + it.arrival_s, f"req-{i}")
            else:
                async with sem:
                    results[i] = await _one(h, url, model, it, time.monotonic(), f"req-{i}")
            done += 1
            if on_request_done is not None:
                on_request_done(done, len(measured))

        await asyncio.gather(*(measured_one(i) for i in range(len(measured))))
        wall_s = time.monotonic() - t0
    return [r for r in results if r is not None], wall_s, before


def kv_blocks_in_use(url: str, headers: dict[str, str], settle_s: float = 2.0) -> int | None:
    """``trtpipe:kv_blocks_in_use`` from ``/metrics`` once it reaches 0 (or after ``settle_s``);
    None when the server does not export it (another server)."""
    deadline = time.monotonic() + settle_s
    while True:
        text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("trtpipe:kv_blocks_in_use")]
        if not values:
            return None
        if values[0] == 0 or time.monotonic() > deadline:
            return int(values[0])
        time.sleep(0.05)


def _first_token_path(url: str, headers: dict[str, str]) -> dict[str, tuple[float, int]]:
    """The server's ``first_token_path_seconds`` (sum, count) per stage; {} from another server."""
    return read_first_token_path(httpx.get(url + "/metrics", headers=headers, timeout=30).text)


def run_workload_http(
    url: str,
    model: str,
    items: Sequence[WorkItem],
    concurrency: int | None = None,
    *,
    api_key: str | None = None,
    on_request_done: Callable[[int, int], None] | None = None,
) -> tuple[list[RequestMetrics], float, StepStats]:
    """The HTTP twin of :func:`~trtpipe.runtime.measure.workload.run_workload`: same items, same
    open/closed loop rules, same return shape (measured requests' metrics in item order, wall
    seconds, step stats holding only the KV leak check read from ``/metrics``)."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    metrics, wall_s, before = asyncio.run(_run(url, model, items, concurrency, headers, on_request_done))
    stats = StepStats(server_first_token_path_ms=mean_ms_between(before, _first_token_path(url, headers)))
    leftover = kv_blocks_in_use(url, headers)
    if leftover is not None:
        stats.on_run_end(leftover)
    return metrics, wall_s, stats


__all__ = ["HttpTokenizer", "HttpWorkloadError", "run_workload_http", "kv_blocks_in_use"]
