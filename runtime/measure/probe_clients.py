"""The two :class:`~trtpipe.runtime.measure.engine_probes.ProbeClient` s: in process (an
:class:`~trtpipe.runtime.serve.engine_loop.EngineLoop` over the LLM, the server's own engine
thread, without HTTP) and over HTTP (streamed ``POST /v1/completions``; a cancel is a closed
stream, confirmed by ``/metrics``). :func:`measure_engine_probes` runs the probes with either.

Requests: greedy, ``ignore_eos`` (so they run their full length unless cancelled), token ids as
the prompt.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trtpipe.runtime.measure.engine_probes import PROBE_TIMEOUT_S, ProbeResult, Stream, run_probes
from trtpipe.runtime.sample.params import SamplingParams

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM


class InProcessProbeClient:
    """Probe requests on an engine thread over ``llm`` (idle when given; its thread is stopped by
    :meth:`close`, after which the caller may step ``llm`` again). Build it inside the event loop."""

    def __init__(self, llm: LLM) -> None:
        from trtpipe.runtime.serve.engine_loop import EngineLoop

        self.engine = EngineLoop(llm, max_queued_requests=1 << 30).start()
        self.loop = asyncio.get_running_loop()
        self._ids = itertools.count()
        self._rid: dict[int, str] = {}  # id(stream) -> request id
        self._final: dict[int, tuple[asyncio.Event, list[float]]] = {}  # id(stream) -> (done, [t_final])

    async def start(self, prompt_ids: Sequence[int], max_tokens: int, cache_salt: str | None = None) -> Stream:
        from trtpipe.runtime.serve.engine_loop import Delta

        params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        rid = f"probe-{next(self._ids)}"
        req = self.engine.llm.new_request(list(prompt_ids), params, request_id=rid, cache_salt=cache_salt)
        stream = Stream(time.monotonic())
        done, t_final = asyncio.Event(), []

        def on_event(event: Any, t: float) -> None:  # on the event loop
            if isinstance(event, Delta):
                stream.token_times_s.extend([t] * len(event.token_ids))
            else:
                stream.done = True
                t_final.append(t)
                done.set()

        def sink(event: Any) -> None:  # engine thread: the time the engine sent it
            self.loop.call_soon_threadsafe(on_event, event, time.monotonic())

        self._rid[id(stream)], self._final[id(stream)] = req.request_id, (done, t_final)
        self.engine.submit(req, sink)
        return stream

    async def cancel(self, stream: Stream) -> float:
        done, t_final = self._final[id(stream)]
        if stream.done:
            return 0.0
        t0 = time.monotonic()
        self.engine.cancel(self._rid[id(stream)])  # the Final is sent after LLM.cancel freed the KV
        await asyncio.wait_for(done.wait(), PROBE_TIMEOUT_S)
        return t_final[0] - t0

    async def close(self) -> None:
        await self.loop.run_in_executor(None, self.engine.shutdown, 0.0)


class HttpProbeClient:
    """Probe requests to a ``trtpipe serve`` at ``url`` (build it inside the event loop)."""

    def __init__(self, url: str, model: str, headers: dict[str, str]) -> None:
        import httpx

        self.url, self.model = url.rstrip("/"), model
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.h = httpx.AsyncClient(timeout=httpx.Timeout(PROBE_TIMEOUT_S, connect=30), headers=headers, limits=limits)
        self._tasks: dict[int, asyncio.Future] = {}

    async def start(self, prompt_ids: Sequence[int], max_tokens: int, cache_salt: str | None = None) -> Stream:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        stream = Stream(time.monotonic())
        self._tasks[id(stream)] = asyncio.ensure_future(self._run(stream, body))
        return stream

    async def _run(self, stream: Stream, body: dict) -> None:
        from trtpipe.runtime.measure.http_client import HttpWorkloadError

        try:
            async with self.h.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raise HttpWorkloadError(f"engine probe: HTTP {r.status_code} {(await r.aread())[:300]!r}")
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        n = len(choices[0].get("token_ids") or ())
                        stream.token_times_s.extend([time.monotonic()] * n)
        finally:
            stream.done = True

    async def _aborts(self) -> float:
        text = (await self.h.get(self.url + "/metrics")).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("trtpipe:request_success_total{") and 'finished_reason="abort"' in line
        )

    async def cancel(self, stream: Stream) -> float:
        task = self._tasks[id(stream)]
        if stream.done:
            return 0.0
        before = await self._aborts()
        t0 = time.monotonic()
        task.cancel()  # closes the connection: the server sees http.disconnect and cancels
        await asyncio.gather(task, return_exceptions=True)
        deadline = t0 + PROBE_TIMEOUT_S
        while await self._aborts() < before + 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine probe: {self.url} did not count the cancelled request as aborted")
            await asyncio.sleep(0.005)
        return time.monotonic() - t0

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.h.aclose()


def measure_engine_probes(
    make_client: Callable[[], Any],
    short_ids: Sequence[int],
    long_ids: Sequence[int],
    max_batch_size: int,
    max_seq_len: int,
    *,
    cancel: bool,
    itl: bool,
) -> ProbeResult:
    """Run :func:`~trtpipe.runtime.measure.engine_probes.run_probes` with the client
    ``make_client()`` builds (inside the probe's event loop)."""

    async def main() -> ProbeResult:
        client = make_client()
        return await run_probes(client, short_ids, long_ids, max_batch_size, max_seq_len, cancel=cancel, itl=itl)

    return asyncio.run(main())


__all__ = ["HttpProbeClient", "InProcessProbeClient", "measure_engine_probes"]
