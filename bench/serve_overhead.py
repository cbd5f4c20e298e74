"""Server overhead per token: TPOT over HTTP (`trtpipe serve`, streamed, measured at the client)
vs TPOT in-process (`LLM.stream`), batch 1, same prompt and length, interleaved in one run.

    .venv/bin/python bench/serve_overhead.py [--rounds 8] [--tokens 64] [--threads 2]

Both sides use the same artifact and thread count; only one runs at a time (the server idles while
the in-process LLM runs and vice versa). Prints per-round figures, medians and the ratio
HTTP / in-process; the difference is what HTTP, SSE framing, the event loop and the engine-thread
hand-off add per token. Then the server's own split of each HTTP request's TTFT: every stage of
``trtpipe:first_token_path_seconds`` (read from ``/metrics`` around each request;
:mod:`trtpipe.runtime.serve.first_token_path` defines the stages), the HTTP TTFT minus the same
request's engine stage (the HTTP path's cost without the engine's run-to-run spread), and what is
outside the server's stages (uvicorn before the handler, the loopback, the client). Loopback only; the server is always stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from serve_util import ServerProcess  # noqa: E402

from trtpipe.runtime.serve.first_token_path import STAGES  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def http_tpot_ms(h: httpx.Client, url: str, model: str, tokens: int) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of one streamed request at the client (chunk arrival times), sent on
    ``h``'s kept-alive connection as the ``openai`` client and vLLM's bench client do: the clock
    starts when the request is sent, not when a client is constructed (``httpx.Client()`` loads a
    CA bundle: 15-130 ms on a 2-core Zen 3, the client's cost, not the server's)."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    times: list[float] = []
    t0 = time.monotonic()
    with h.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                times.extend([time.monotonic()] * len(choice.get("token_ids") or ()))
    assert len(times) == tokens, len(times)
    return (times[0] - t0) * 1e3, (times[-1] - times[0]) / (tokens - 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams
    from trtpipe.runtime.serve.first_token_path import mean_ms_between, read_first_token_path

    llm = LLM(a.artifact, num_threads=a.threads)
    params = SamplingParams(max_new_tokens=a.tokens, ignore_eos=True)
    with ServerProcess(Path(a.artifact), "--threads", str(a.threads)) as server, httpx.Client(timeout=120) as h:
        model = h.get(server.url + "/v1/models").json()["data"][0]["id"]
        http_tpot_ms(h, server.url, model, 8)  # warm-up both (and opens the connection)
        list(llm.stream(PROMPT, params))
        rows = []
        for i in range(a.rounds):
            for _ in llm.stream(PROMPT, params):
                pass
            m = llm.last_output.metrics
            inproc = (m.ttft_s * 1e3, m.tpot_s * 1e3)
            before = read_first_token_path(h.get(server.url + "/metrics").text)
            http = http_tpot_ms(h, server.url, model, a.tokens)
            stages = dict(mean_ms_between(before, read_first_token_path(h.get(server.url + "/metrics").text)))
            rows.append((inproc, http, stages))
            print(
                f"round {i}: in-process TTFT {inproc[0]:7.1f} ms TPOT {inproc[1]:6.2f} ms | "
                f"HTTP TTFT {http[0]:7.1f} ms TPOT {http[1]:6.2f} ms | server engine stage {stages['engine']:7.1f} ms"
            )
    _report(rows)


def _report(rows: list) -> None:
    med = statistics.median
    ip, hp = med(r[0][1] for r in rows), med(r[1][1] for r in rows)
    it, ht = med(r[0][0] for r in rows), med(r[1][0] for r in rows)
    print(
        f"median TPOT: in-process {ip:.2f} ms, HTTP {hp:.2f} ms -> overhead {hp - ip:+.2f} ms/token "
        f"(ratio {hp / ip:.3f}); median TTFT: in-process {it:.1f} ms, HTTP {ht:.1f} ms ({ht - it:+.1f} ms)"
    )
    split = ", ".join(f"{name} {med(r[2][name] for r in rows):.2f}" for name in STAGES)
    print(f"server's first-token path, median ms per stage: {split}")
    # the same request's client TTFT minus its own engine stage: the HTTP path's cost, free of the
    # engine's run-to-run spread (which the in-process vs HTTP difference above carries)
    print(
        f"  HTTP TTFT minus the same request's engine stage, median: {med(r[1][0] - r[2]['engine'] for r in rows):.2f} ms"
        f" (outside the server's stages: {med(r[1][0] - sum(r[2].values()) for r in rows):.2f} ms)"
    )


if __name__ == "__main__":
    main()
