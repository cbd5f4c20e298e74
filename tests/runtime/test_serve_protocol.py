"""Request validation and response shapes of `trtpipe serve`, without a model (fast): OpenAI's
defaults written down, refusals that name the field, SSE framing that keeps text and ids apart."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from trtpipe.runtime.serve.errors import ServeError  # noqa: E402
from trtpipe.runtime.serve.protocol import parse_chat, parse_completion, parse_json_body  # noqa: E402
from trtpipe.runtime.serve.responses import DONE, ResponseBuilder  # noqa: E402

MODELS = ("m",)


def test_openai_defaults_are_explicit():
    req = parse_completion({"model": "m", "prompt": "hi"}, MODELS)
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.stream) == (16, 1.0, 1.0, 0, False)
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, MODELS)
    assert chat.max_tokens is None  # up to max_seq_len, resolved after tokenizing


def test_fields_map_to_sampling_params():
    req = parse_completion(
        {
            "model": "m",
            "prompt": [1, 2, 3],
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "seed": 4,
            "stop": "\n",
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "return_token_ids": True,
        },
        MODELS,
    )
    assert req.prompt == (1, 2, 3) and req.include_usage and req.return_token_ids
    p = req.sampling_params(req.max_tokens)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.ignore_eos) == (
        7,
        0.0,
        0.5,
        0,
        4,
        ("\n",),
        True,
    )


def test_chat_content_parts_are_joined():
    req = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}
            ],
        },
        MODELS,
    )
    assert req.messages == ({"role": "user", "content": "What is 2+2?"},)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "x", "prompt": "hi"}, "model"),
        ({"model": "m", "prompt": "hi", "temperature": float("nan")}, "temperature"),
        ({"model": "m", "prompt": "hi", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "hi", "best_of": 3}, "best_of"),
        ({"model": "m", "prompt": "hi", "echo": "yes"}, "echo"),
        ({"model": "m", "prompt": "hi", "tools": [{"type": "function"}]}, "tools"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"model": "m", "prompt": "  "}, "prompt"),
    ],
)
def test_refusals_name_the_field(body, param):
    with pytest.raises(ServeError) as e:
        parse_completion(body, MODELS)
    assert e.value.status == 400 and e.value.param == param
    err = e.value.body()["error"]
    assert err["type"] == "invalid_request_error" and param in err["message"] and "Fix" in err["message"]


def test_body_must_be_utf8_json_object():
    deep = b"[" * 100_000 + b"]" * 100_000  # RecursionError in json: was a 500 with a traceback in the log
    for raw in (b"\xc3\x28", b"{", b"[]", deep):
        with pytest.raises(ServeError) as e:
            parse_json_body(raw)
        assert e.value.param == "body"
    assert parse_json_body('{"p": "日本"}'.encode()) == {"p": "日本"}


def test_sse_chunks_keep_text_and_ids_apart():
    req = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        },
        MODELS,
    )
    b = ResponseBuilder(req, (5, 6, 7))
    first = json.loads(b.chunk("", first=True)[6:])
    assert first["object"] == "chat.completion.chunk" and first["prompt_token_ids"] == [5, 6, 7]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    raw = b.chunk("日本", (100, 101))
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and "日本".encode() in raw  # UTF-8, not \\u escapes
    delta = json.loads(raw[6:])["choices"][0]
    assert delta["delta"] == {"content": "日本"} and delta["token_ids"] == [100, 101]
    usage = json.loads(b.usage_chunk(2, 16)[6:])
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 16},
    }
    assert DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize("salt", [42, "", ["a"], {"t": 1}, True])
def test_bad_cache_salt_is_400_naming_the_field(salt):
    with pytest.raises(ServeError) as e:
        parse_chat({"model": MODELS[0], "messages": [{"role": "user", "content": "Hi"}], "cache_salt": salt}, MODELS)
    assert e.value.status == 400 and e.value.param == "cache_salt"
    assert e.value.message.startswith(f"cache_salt = {salt!r}: expected null or a non-empty string")


def test_cache_salt_passes_through():
    doc = {"model": MODELS[0], "prompt": "Hi", "cache_salt": "tenant-1"}
    assert parse_completion(doc, MODELS).cache_salt == "tenant-1"
    assert parse_completion({**doc, "cache_salt": None}, MODELS).cache_salt is None


def test_serve_on_a_port_in_use_is_a_usage_error(tmp_path):
    """bind fails (address in use): exit code 2 with the fix, not uvicorn's SystemExit(3), which
    is trtpipe's "GPU build spec written" code. No model is needed: bind fails before loading ends."""
    import socket

    pytest.importorskip("uvicorn")
    from trtpipe.runtime.serve.server import ServeConfig, serve

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    lines: list[str] = []
    try:
        code = serve(ServeConfig(artifact_dir=tmp_path, model_name="m", port=port), echo=lines.append)
    finally:
        held.close()
    assert code == 2
    assert any(f"--port {port}: could not listen" in ln and "Fix: pass a free --port" in ln for ln in lines), lines
    assert not any("listening at" in ln for ln in lines), lines  # it was printed before the bind failed


def test_bound_url_names_the_port_actually_bound():
    """--port 0: the ready line names the port the OS picked (it said http://127.0.0.1:0)."""
    import socket
    from types import SimpleNamespace

    pytest.importorskip("uvicorn")
    from trtpipe.runtime.serve.server import bound_url

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        port = sock.getsockname()[1]
        server = SimpleNamespace(servers=[SimpleNamespace(sockets=[sock])])
        assert bound_url(server, "http://127.0.0.1:0") == f"http://127.0.0.1:{port}"
        assert bound_url(SimpleNamespace(), "http://127.0.0.1:0") == "http://127.0.0.1:0"  # not listening yet
    finally:
        sock.close()


def test_ignored_fields_are_counted_with_a_bounded_label_set():
    """Unknown fields are ignored and counted; past 64 distinct names they count as "_other", so
    clients cannot grow /metrics without bound. Known refused fields are 400s, not counts."""
    from serve_util import read_metrics

    from trtpipe.runtime.serve.prometheus import MAX_IGNORED_FIELD_LABELS, ServeMetrics

    req = parse_chat({**_CHAT, "x_trace": 1, "vendor_opt": {"a": 1}}, MODELS)
    assert req.ignored_fields == ("vendor_opt", "x_trace")
    m = ServeMetrics("m")
    for i in range(MAX_IGNORED_FIELD_LABELS + 5):
        m.on_ignored_fields((f"f{i}",))
    got = read_metrics(m.render().decode())
    assert got['trtpipe:ignored_request_fields_total{field="f0"}'] == 1
    assert got['trtpipe:ignored_request_fields_total{field="_other"}'] == 5
    with pytest.raises(ServeError) as e:
        parse_chat({**_CHAT, "tools": [{"type": "function"}]}, MODELS)
    assert e.value.param == "tools"


_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"temperature": 2.5}, "temperature"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}},
         "response_format.json_schema.name"),
        ({"response_format": {"type": "json_object"}, "guided_json": {"type": "object"}}, "guided_json"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages[0].colour"),
    ],
)  # fmt: skip
def test_strict_chat_fields(extra, param):
    with pytest.raises(ServeError) as e:
        parse_chat({**_CHAT, **extra}, MODELS)
    assert e.value.status == 400 and e.value.param == param and "Fix" in e.value.message


def test_supported_fields_reach_the_sampling_params():
    req = parse_chat(
        {
            **_CHAT,
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.2,
            "logit_bias": {"7": -100, "9": 3.5},
            "min_tokens": 2,
            "stop_token_ids": [2, 5],
            "n": 3,
            "seed": 10,
            "logprobs": True,
            "top_logprobs": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
        },
        MODELS,
    )
    assert req.messages[0] == {"role": "system", "content": "be brief"}  # developer renders as system
    p = req.sampling_params(16, index=2)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.logit_bias, p.min_tokens, p.stop_token_ids, p.seed, p.logprobs) == (
        ((7, -100.0), (9, 3.5)),
        2,
        (2, 5),
        12,
        4,
    )
    assert req.n == 3 and p.structured is not None and p.structured.schema == {"type": "object"}
    p.validate()


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/v1/chat", 404), ("GET", "/v1/chat/completions", 405)])
def test_unknown_path_and_wrong_method_answer_in_openai_error_shape(method, path, status):
    """Starlette's own 404 / 405 bodies are {"detail": ...}; OpenAI clients read error.message."""
    from starlette.testclient import TestClient

    from trtpipe.runtime.serve.app import create_app
    from trtpipe.runtime.serve.state import ServeState

    with TestClient(create_app(ServeState(model_name="m"))) as client:
        r = client.request(method, path)
    err = r.json()["error"]
    assert r.status_code == status and err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"{method} {path}: ") and "POST /v1/chat/completions" in err["message"]
    if status == 405:
        assert r.headers["allow"] == "POST"
