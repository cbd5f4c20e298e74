"""The Prometheus histograms of `trtpipe serve` hold exactly the per-request metrics that
`trtpipe validate` reports (runtime/metrics/request_metrics.py) for the same requests: counts and sums agree.

The server runs in this process (uvicorn in a thread) so the test can see each request's own
RequestMetrics record next to the /metrics text; the engine loop is the one `trtpipe serve` uses.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import httpx
import pytest
from serve_util import free_port, read_metrics

pytestmark = pytest.mark.slow
uvicorn = pytest.importorskip("uvicorn")

MODEL = "smollm2-135m-cpu"


@pytest.fixture(scope="module")
def served(default_artifact):
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.serve.app import create_app
    from trtpipe.runtime.serve.engine_loop import EngineLoop
    from trtpipe.runtime.serve.prometheus import ServeMetrics
    from trtpipe.runtime.serve.server import engine_readings
    from trtpipe.runtime.serve.state import ServeState

    llm = LLM(default_artifact)
    records = []
    metrics = ServeMetrics(MODEL)

    def on_finished(out):
        records.append(out)
        metrics.on_finished(out)

    engine = EngineLoop(llm, max_queued_requests=64, on_finished=on_finished).start()
    metrics.bind(engine_readings(llm, engine))
    state = ServeState(model_name=MODEL, engine=engine, metrics=metrics)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", records, llm
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        engine.shutdown(0)


def test_histograms_agree_with_per_request_metrics(served):
    url, records, llm = served

    async def run() -> None:
        async with httpx.AsyncClient(timeout=120) as h:
            bodies = [
                {
                    "model": MODEL,
                    "prompt": f"Tell me about {topic}.",
                    "max_tokens": n,
                    "ignore_eos": True,
                    "temperature": 0,
                    "stream": i % 2 == 0,
                }
                for i, (topic, n) in enumerate(
                    [("rivers", 12), ("bread", 1), ("trains", 7), ("copper", 20), ("the moon", 3), ("winter", 9)]
                )
            ]
            rs = await asyncio.gather(*(h.post(url + "/v1/completions", json=b) for b in bodies))
            assert all(r.status_code == 200 for r in rs)

    asyncio.run(run())
    m = read_metrics(httpx.get(url + "/metrics", timeout=10).text)
    got = [o.metrics for o in records]
    assert len(got) == 6
    ttft = [r.ttft_s for r in got if r.ttft_s is not None]
    tpot = [r.tpot_s for r in got if r.tpot_s is not None]
    itl = [g for r in got for g in r.itl_s]
    e2e = [r.e2e_s for r in got if r.e2e_s is not None]
    queue = [r.queue_s for r in got if r.queue_s is not None]
    assert (len(ttft), len(tpot), len(itl)) == (6, 5, 11 + 0 + 6 + 19 + 2 + 8)  # hand count: n - 1 gaps each
    for name, values in (
        ("time_to_first_token_seconds", ttft),
        ("request_time_per_output_token_seconds", tpot),
        ("inter_token_latency_seconds", itl),
        ("e2e_request_latency_seconds", e2e),
        ("request_queue_time_seconds", queue),
    ):
        assert m[f"trtpipe:{name}_count"] == len(values), name
        assert math.isclose(m[f"trtpipe:{name}_sum"], math.fsum(values), rel_tol=1e-9, abs_tol=1e-12), name
        # the cumulative +Inf bucket equals the count; the 10 s bucket holds every value below it
        assert m[f'trtpipe:{name}_bucket{{le="+Inf"}}'] == len(values)
        assert m[f'trtpipe:{name}_bucket{{le="10.0"}}'] == sum(v <= 10.0 for v in values)
    assert m["trtpipe:generation_tokens_total"] == 12 + 1 + 7 + 20 + 3 + 9
    assert m["trtpipe:prompt_tokens_total"] == sum(r.prompt_tokens for r in got)
    assert m['trtpipe:request_success_total{finished_reason="length"}'] == 6
    assert m["trtpipe:kv_blocks_in_use"] == 0 and m["trtpipe:num_requests_running"] == 0
    # the first token's path: one observation per stage for each of the 3 streams (not the 3
    # non-streamed); each stream's prefill ran between its pickup and the end of its first step
    stages = ("parse", "tokenize", "submit", "pickup", "engine", "publish", "write")
    for stage in stages:
        assert m[f'trtpipe:first_token_path_seconds_count{{stage="{stage}"}}'] == 3, stage
    streamed = [o.metrics for o in records if o.metrics.output_tokens in (12, 7, 3)]
    engine_s = m['trtpipe:first_token_path_seconds_sum{stage="engine"}']
    assert engine_s >= math.fsum(r.prefill_s for r in streamed) > 0


def test_disconnect_to_free_time(served):
    """Close a stream after two chunks; time until the KV pool is back to 0 blocks, read directly
    from the block pool every 1 ms (no /metrics scrape in the way). Five rounds; bound 1 s."""
    url, records, llm = served
    body = {
        "model": MODEL,
        "prompt": "Tell me a long story.",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    times_ms = []
    with httpx.Client(timeout=60) as h:
        for _ in range(5):
            with h.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                for _ in range(2):
                    while not next(lines).startswith("data: "):
                        pass
                assert llm.block_pool.num_used > 0
                closed_at = time.monotonic()
            while llm.block_pool.num_used:
                assert time.monotonic() - closed_at < 1.0, "KV not freed within 1 s of the disconnect"
                time.sleep(0.001)
            times_ms.append((time.monotonic() - closed_at) * 1e3)
    assert records[-1].finish_reason == "abort"
    print(f"\ndisconnect-to-free: {', '.join(f'{t:.0f}' for t in times_ms)} ms (median {sorted(times_ms)[2]:.0f} ms)")


SYSTEM = (
    "You are a careful assistant for a travel agency in Lyon. Answer in one short sentence, name "
    "places precisely, never invent prices, and say so when you do not know. The agency sells train "
    "trips across France, Italy and Switzerland, and city breaks of two to five nights."
)


def test_prefix_cache_over_openai_client_cache_salt_and_metrics(served):
    """Two chats sharing a long system prompt: the second reports cached_tokens (a whole number of
    KV blocks) and the same greedy text as the same chat under another cache_salt (0 cached:
    salted blocks are a separate cache). /metrics' prefix-cache counters equal the LLM's."""
    openai = pytest.importorskip("openai")
    url, records, llm = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)
    block = llm.kv_manager.block_size

    def chat(question: str, **extra):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=8, **extra)

    first = chat("Which city is the agency in?")
    second = chat("Name one Swiss city you sell trips to.")
    salted = chat("Name one Swiss city you sell trips to.", extra_body={"cache_salt": "tenant-b"})
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens and cached % block == 0, (cached, block)
    assert cached >= 3 * block  # the system prompt alone is over 50 tokens
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    assert salted.choices[0].message.content == second.choices[0].message.content
    assert first.usage.prompt_tokens_details.cached_tokens % block == 0

    stream = chat(
        "Name one Swiss city you sell trips to.",
        extra_body={"cache_salt": "tenant-b"},
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    n = usage[0].prompt_tokens  # a repeat: every full block but the one holding the last prompt token
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens == (n - 1) // block * block

    m = read_metrics(httpx.get(url + "/metrics", timeout=10).text)
    assert m["trtpipe:prefix_cache_queries_total"] == llm.prefix_cache_queries > 0
    hits = m["trtpipe:prefix_cache_hits_total"]
    assert hits == llm.prefix_cache_hits >= cached + usage[0].prompt_tokens_details.cached_tokens

    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=10,
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "cache_salt": 7},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    assert "cache_salt = 7: expected null or a non-empty string" in r.json()["error"]["message"]


def test_engine_error_fails_the_step_frees_kv_then_dead_loop_turns_health_503(served, monkeypatch):
    """A failing engine step ends that step's requests with an error (stream: an error event, then
    [DONE]; non-stream: 500) and frees their KV; the server keeps serving. After
    MAX_FAILED_STEPS_IN_A_ROW failures in a row the loop stops and /health answers 503.
    (Runs last in this module: it kills the module's engine.)"""
    url, records, llm = served
    real_decode = llm.engine.decode
    calls = {"n": 0}

    def flaky_decode(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected decode failure")
        return real_decode(batch)

    monkeypatch.setattr(llm.engine, "decode", flaky_decode)
    body = {"model": MODEL, "prompt": "Tell me about rivers.", "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    with httpx.Client(timeout=60) as h:
        r = h.post(url + "/v1/completions", json=body)
        assert r.status_code == 500 and "injected decode failure" in r.json()["error"]["message"]
        assert llm.block_pool.num_used == 0
        r = h.post(url + "/v1/completions", json=body)  # the next request is served normally
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8

        def broken(batch):
            raise RuntimeError("broken engine")

        monkeypatch.setattr(llm.engine, "prefill", broken)  # every step fails now
        lines = []
        for _ in range(3):
            with h.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as s:
                lines += [x for x in s.iter_lines() if x.startswith("data: ")]
        assert sum('"error"' in x for x in lines) == 3 and lines[-1] == "data: [DONE]"
        assert llm.block_pool.num_used == 0
        health = h.get(url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
        assert h.post(url + "/v1/completions", json=body).status_code == 503


def test_a_request_is_observed_before_its_client_sees_the_end(default_artifact):
    """A client that scrapes /metrics right after its final chunk finds its request counted: the
    engine thread calls ``on_finished`` (the Prometheus observation) before it hands the request's
    ``Final`` event to the client's sink (both run in the engine thread, so the order is exact)."""
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams
    from trtpipe.runtime.serve.engine_loop import EngineLoop, Final

    llm = LLM(default_artifact)
    observed: list[str] = []
    at_final: list[list[str]] = []
    done = threading.Event()

    def sink(event) -> None:
        if isinstance(event, Final):
            at_final.append(list(observed))
            done.set()

    engine = EngineLoop(llm, max_queued_requests=4, on_finished=lambda out: observed.append(out.request_id)).start()
    try:
        rid = engine.submit(
            llm.new_request(llm.tokenizer.encode("Hello"), SamplingParams(max_new_tokens=2, ignore_eos=True)), sink
        )
        assert done.wait(60), "the request did not finish"
        assert at_final == [[rid]]
    finally:
        engine.shutdown(0)
