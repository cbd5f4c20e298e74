"""`trtpipe serve` on the real model, through the official `openai` client (the API oracle) and
raw httpx: completions and chat (stream and non-stream), greedy output == LLM.generate, token ids
apart from text, CJK/emoji streaming without U+FFFD, disconnect frees KV within 1 s, a queued
request whose client left never runs, and a bad-input table over every field."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import pytest
from conftest import FRANCE_PROMPT
from reference_outputs import assert_text_follows_reference
from serve_util import ServerProcess

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-cpu"
REPLACEMENT_CHAR = "\ufffd"


@pytest.fixture(scope="module")
def server(default_artifact):
    # no predicted-wait limit: these tests queue requests behind a full batch of long ones on purpose
    with ServerProcess(default_artifact, "--max-queued-requests", "64", "--max-queue-wait-ms", "0") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llm(default_artifact):
    from trtpipe.runtime.llm import LLM

    return LLM(default_artifact)


def test_chat_france_answers_as_the_reference(server, client, default_artifact):
    """The done criterion: the official client gets the fp32 reference's answer ("The capital of
    France is Paris."); the server process never loaded torch."""
    import psutil

    r = client.chat.completions.create(
        model=MODEL, temperature=0, messages=[{"role": "user", "content": FRANCE_PROMPT}]
    )
    assert_text_follows_reference(r.choices[0].message.content, default_artifact, FRANCE_PROMPT)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 37  # TOOLCHAIN.md: the templated question is 37 tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert not [m.path for m in psutil.Process(server.pid).memory_maps() if "torch" in m.path]


def test_greedy_over_http_equals_llm_generate(client, llm):
    """Same prompt, greedy: HTTP (chat and completions, stream and not) == LLM.generate."""
    from trtpipe.runtime.sample.params import SamplingParams

    want_chat = llm.generate([FRANCE_PROMPT], SamplingParams(max_new_tokens=24), chat=True)[0]
    prompt = "The lighthouse keeper climbed the stairs and"
    want_cmpl = llm.generate([prompt], SamplingParams(max_new_tokens=24))[0]
    msgs = [{"role": "user", "content": FRANCE_PROMPT}]
    chat = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=24, messages=msgs, extra_body={"return_token_ids": True}
    )
    assert chat.choices[0].message.content == want_chat.text
    assert chat.choices[0].token_ids == want_chat.output_token_ids
    assert chat.prompt_token_ids == list(want_chat.prompt_token_ids)
    streamed = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=24, messages=msgs, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want_chat.text
    cmpl = client.completions.create(
        model=MODEL, temperature=0, max_tokens=24, prompt=prompt, extra_body={"return_token_ids": True}
    )
    assert cmpl.choices[0].text == want_cmpl.text
    assert cmpl.choices[0].token_ids == want_cmpl.output_token_ids
    assert cmpl.usage.completion_tokens == len(want_cmpl.output_token_ids)
    assert cmpl.choices[0].finish_reason == want_cmpl.finish_reason
    pieces, ids = [], []
    for c in client.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=24,
        prompt=prompt,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    ):
        if c.choices:
            pieces.append(c.choices[0].text)
            ids.extend(c.choices[0].token_ids or [])
        else:
            usage = c.usage
    assert "".join(pieces) == want_cmpl.text and ids == want_cmpl.output_token_ids
    assert usage.completion_tokens == 24 and usage.prompt_tokens == len(want_cmpl.prompt_token_ids)


def test_return_token_ids_decode_to_text(client, llm):
    r = client.completions.create(
        model=MODEL,
        temperature=0.8,
        seed=3,
        max_tokens=32,
        prompt="Write a short note about rivers.",
        extra_body={"return_token_ids": True},
    )
    ids = r.choices[0].token_ids
    assert len(ids) == r.usage.completion_tokens > 0
    assert llm.tokenizer.backend.decode(ids, skip_special_tokens=True) == r.choices[0].text
    assert llm.tokenizer.encode("Write a short note about rivers.") == r.prompt_token_ids


@pytest.mark.parametrize(
    "kind,prompt",
    [
        ("completion", "北京是中国的首都，"),
        ("completion", "東京は日本の首都で、"),
        ("completion", "🙂🙂🙂 😀😀"),
        ("chat", "日本の首都はどこですか？日本語で答えてください。"),
        ("chat", "Reply with three emoji that describe happiness: 😀"),
    ],
)
def test_multibyte_streaming_equals_non_stream(client, kind, prompt):
    """Characters split across byte-level BPE tokens are held back, never sent as U+FFFD; the
    concatenated deltas equal the non-streamed text."""
    kw = dict(model=MODEL, temperature=0, max_tokens=40)
    if kind == "chat":
        kw["messages"] = [{"role": "user", "content": prompt}]
        full = client.chat.completions.create(**kw).choices[0].message.content
        deltas = [
            c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
        ]
    else:
        full = client.completions.create(prompt=prompt, **kw).choices[0].text
        deltas = [c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **kw) if c.choices]
    assert "".join(deltas) == full
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert any(ord(ch) > 0x2E80 for ch in full), f"no CJK/emoji produced, the test checks nothing: {full!r}"


def _kv_blocks(server) -> float:
    return server.metrics()["trtpipe:kv_blocks_in_use"]


def test_disconnect_frees_kv_within_one_second(server):
    """Open a stream, read two chunks, close the socket: KV blocks back to baseline within 1 s."""
    baseline = _kv_blocks(server)
    body = {
        "model": MODEL,
        "prompt": "Tell me a long story about a lighthouse.",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            chunks = [next(line for line in lines if line.startswith("data: ")) for _ in range(2)]
            assert all(json.loads(c[6:])["choices"] for c in chunks)
            assert _kv_blocks(server) > baseline
            closed_at = time.monotonic()
    # leaving the `with` closes the connection
    while _kv_blocks(server) != baseline:
        assert time.monotonic() - closed_at < 1.0, "KV blocks not freed within 1 s of the disconnect"
        time.sleep(0.01)
    print(f"disconnect-to-free: {(time.monotonic() - closed_at) * 1e3:.0f} ms (at most; /metrics polled)")
    assert server.metrics()['trtpipe:request_success_total{finished_reason="abort"}'] >= 1


def test_queued_request_whose_client_left_never_runs(server):
    """Fill the running batch (8), queue one more, close its connection while it waits: it is
    dropped without a prefill (the queue-time histogram counts only the 8)."""
    before = server.metrics()
    q0 = before.get("trtpipe:request_queue_time_seconds_count", 0.0)
    a0 = before.get('trtpipe:request_success_total{finished_reason="abort"}', 0.0)
    body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(timeout=60)) for _ in range(8)]
        streams = [stack.enter_context(h.stream("POST", server.url + "/v1/completions", json=body)) for h in clients]
        lines = [s.iter_lines() for s in streams]  # kept: a dropped iterator closes its connection
        for it in lines:  # the first chunk of each: all 8 are running
            while not next(it).startswith("data: "):
                pass
        with httpx.Client(timeout=60) as h, h.stream("POST", server.url + "/v1/completions", json=body):
            time.sleep(0.3)
            assert server.metrics()["trtpipe:num_requests_waiting"] == 1
        deadline = time.monotonic() + 5
        while server.metrics()["trtpipe:num_requests_waiting"] != 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert server.metrics()["trtpipe:num_requests_running"] == 8
    deadline = time.monotonic() + 5
    while _kv_blocks(server) != 0:
        assert time.monotonic() < deadline, "KV not freed after the clients left"
        time.sleep(0.02)
    after = server.metrics()
    assert after["trtpipe:request_queue_time_seconds_count"] - q0 == 8  # the 9th was never admitted
    assert after['trtpipe:request_success_total{finished_reason="abort"}'] - a0 == 9


LONG_PROMPT = "word " * 2100  # > max_seq_len 2048 tokens

BAD_INPUTS = [  # (endpoint, body (dict -> JSON, bytes -> raw), field named)
    ("completions", b"{not json", "body"),
    ("completions", b'\xff\xfe{"model": 1}', "body"),
    ("completions", [1, 2], "body"),
    ("completions", {"model": "gpt-4", "prompt": "hi"}, "model"),
    ("completions", {"prompt": "hi"}, "model"),
    ("completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("completions", {"model": MODEL, "prompt": 5}, "prompt"),
    ("completions", {"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": LONG_PROMPT}, "prompt"),
    ("completions", {"model": MODEL, "prompt": [999999]}, "prompt"),
    ("chat", {"model": MODEL, "messages": []}, "messages"),
    ("chat", {"model": MODEL, "messages": "hi"}, "messages"),
    ("chat", {"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
    ("chat", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}]}, "messages"),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": "10"}, "max_tokens"),
    (
        "chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
        "max_completion_tokens",
    ),
    ("completions", {"model": MODEL, "prompt": "hi", "temperature": -0.1}, "temperature"),
    ("completions", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ("completions", {"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p"),
    ("completions", {"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p"),
    ("completions", {"model": MODEL, "prompt": "hi", "top_k": -2}, "top_k"),
    ("completions", {"model": MODEL, "prompt": "hi", "seed": -1}, "seed"),
    ("completions", {"model": MODEL, "prompt": "hi", "n": 9}, "n"),
    ("completions", {"model": MODEL, "prompt": "hi", "stop": 5}, "stop"),
    ("completions", {"model": MODEL, "prompt": "hi", "stop": [""]}, "stop"),
    ("completions", {"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ("completions", {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"model": MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),
    ("completions", {"model": MODEL, "prompt": "hi", "ignore_eos": "x"}, "ignore_eos"),
    ("completions", {"model": MODEL, "prompt": "hi", "return_token_ids": 1}, "return_token_ids"),
]


def test_bad_input_table(server):
    """Each bad request: 400, an OpenAI error body naming the field; a concurrent good streamed
    request completes untouched."""
    good: dict = {}

    def run_good() -> None:
        body = {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": 48,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        with httpx.Client(timeout=120) as h, h.stream("POST", server.url + "/v1/completions", json=body) as r:
            good["status"] = r.status_code
            good["chunks"] = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]

    t = threading.Thread(target=run_good)
    t.start()
    with httpx.Client(timeout=60) as h:
        for endpoint, body, field in BAD_INPUTS:
            url = server.url + ("/v1/completions" if endpoint == "completions" else "/v1/chat/completions")
            r = (
                h.post(url, content=body, headers={"content-type": "application/json"})
                if isinstance(body, bytes)
                else h.post(url, json=body)
            )
            assert r.status_code == 400, (field, r.status_code, r.text)
            err = r.json()["error"]
            assert err["param"] == field, (field, err)
            assert field in err["message"] and "fix" in err["message"].lower(), err
    t.join(timeout=120)
    assert good["status"] == 200
    texts = [c["choices"][0]["text"] for c in good["chunks"] if c["choices"]]
    assert good["chunks"][-1]["choices"][0]["finish_reason"] == "length" and len("".join(texts)) > 0
    assert server.metrics()['trtpipe:requests_rejected_total{reason="bad_request"}'] >= len(BAD_INPUTS)


def test_max_tokens_past_the_context_is_a_400_like_vllm(client):
    """max_tokens that does not fit max_seq_len - prompt is refused as vLLM and OpenAI do ("This
    model's maximum context length is N tokens. However, you requested M tokens ..."), naming the
    field, the value, the limit and the fix; not capped silently. Exactly the room is accepted, and
    OpenAI's implicit completions default (16) is capped to the room (the client asked nothing)."""
    max_len = client.models.list().data[0].to_dict()["max_model_len"]
    prompt_ids = [504] * (max_len - 3)  # room for exactly 3 output tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=4)
    assert (e.value.status_code, e.value.param, e.value.code) == (400, "max_tokens", "context_length_exceeded")
    assert e.value.body["message"] == (
        f"max_tokens = 4: this model's maximum context length is {max_len} tokens. However, you "
        f"requested {max_len + 1} tokens ({max_len - 3} in the prompt, 4 in the completion); expected "
        "max_tokens <= 3. Fix: send max_tokens <= 3, or a shorter prompt."
    )
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": FRANCE_PROMPT}], max_completion_tokens=100_000
        )
    assert e.value.param == "max_completion_tokens"
    assert e.value.body["message"] == (
        f"max_completion_tokens = 100000: this model's maximum context length is {max_len} tokens. "
        f"However, you requested {100_000 + 37} tokens (37 in the messages, 100000 in the completion); "
        f"expected max_completion_tokens <= {max_len - 37}. Fix: send max_completion_tokens <= "
        f"{max_len - 37}, or shorter messages, or drop max_completion_tokens (chat then generates up to "
        "the context length)."
    )
    for kw in ({"max_tokens": 3}, {}):
        r = client.completions.create(
            model=MODEL, prompt=prompt_ids, temperature=0, extra_body={"ignore_eos": True}, **kw
        )
        assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (3, "length"), kw


@pytest.mark.parametrize("body", [{"prompt": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}])
def test_tokenize_add_special_tokens_must_be_a_json_boolean(server, body):
    """The string "false" is not false (it is truthy): a 400 naming the field, as every other boolean."""
    with httpx.Client(timeout=30) as h:
        r = h.post(server.url + "/tokenize", json={**body, "add_special_tokens": "false"})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": "add_special_tokens = 'false': expected true or false. Fix: send a JSON boolean (false, "
            'not "false").',
            "type": "invalid_request_error",
            "param": "add_special_tokens",
            "code": None,
        }
        assert h.post(server.url + "/tokenize", json={**body, "add_special_tokens": False}).status_code == 200


def test_models_tokenize_detokenize_health(server):
    with httpx.Client(timeout=30) as h:
        models = h.get(server.url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        tok = h.post(server.url + "/tokenize", json={"prompt": "The capital of France is"}).json()
        assert tok["tokens"] == [504, 3575, 282, 4649, 314] and tok["count"] == 5
        assert (
            h.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
            == "The capital of France is"
        )
        chat = h.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": FRANCE_PROMPT}]})
        assert chat.json()["count"] == 37
        assert h.get(server.url + "/health").status_code == 200
    assert server.health_while_loading == 503  # probed between "listening" and "ready"
    said = [ln.split(": ", 1)[1].split(" (")[0] for ln in server.lines if ln.startswith("trtpipe serve: ")]
    assert said.index(f"listening at {server.url}") < said.index(f"ready at {server.url}"), server.lines
