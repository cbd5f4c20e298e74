"""Golden recording (pipeline/stages/golden.py): the content-addressed cache, exact truncation, progress.

Cache tests use a counting stand-in for the recorder (fast); the exactness of serving n tokens
from an N-token recording and the progress lines run the real reference on a 2-layer SmolLM2
(marked slow).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from trtpipe.pipeline.stages import golden as G


def _key(**over) -> G.GoldenKey:
    base = dict(
        model_sha256="m" * 64,
        model_config_sha256="c" * 64,
        precision="fp32",
        prompts=("a", "b"),
        layer_sliding_window=(0, 0),
        reference_code_sha256="r" * 64,
    )
    return G.GoldenKey(**{**base, **over})


def _fake_recording(n: int) -> dict:
    seqs = [
        {
            "prompt": p,
            "prompt_ids": [1, 2],
            "output_ids": list(range(10 * i, 10 * i + n)),
            "top5": [[[10 * i + t, float(t)]] for t in range(n)],
        }
        for i, p in enumerate("ab")
    ]
    return {"reference": G.REFERENCE_DESCRIPTION, "num_tokens": n, "sequences": seqs}


class _Recorder:
    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, n: int) -> dict:
        self.calls.append(n)
        return _fake_recording(n)


def test_key_changes_with_every_input_it_names():
    k = _key()
    assert len(k.digest()) == 64 and k.digest() == _key().digest()
    for field, value in (
        ("model_sha256", "x" * 64),
        ("model_config_sha256", "y" * 64),
        ("precision", "int4"),
        ("prompts", ("a",)),
        ("layer_sliding_window", (0, 64)),
        ("reference_code_sha256", "z"),
    ):
        assert _key(**{field: value}).digest() != k.digest(), field


def test_second_build_reuses_and_a_shorter_request_is_a_truncation(tmp_path):
    rec, logs = _Recorder(), []
    g1, reused1 = G.cached_golden(tmp_path, _key(), 8, rec, log=logs.append)
    assert (reused1, rec.calls) == (False, [8])
    path = G.cache_path(tmp_path, _key())
    assert path.parent == tmp_path / ".cache" / "golden" and json.loads(path.read_text())["golden"] == g1
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # atomic: no temp file left
    g2, reused2 = G.cached_golden(tmp_path, _key(), 8, rec, log=logs.append)
    assert (reused2, rec.calls, g2) == (True, [8], g1)
    g3, reused3 = G.cached_golden(tmp_path, _key(), 3, rec, log=logs.append)
    assert reused3 and rec.calls == [8]
    assert g3 == _fake_recording(3)  # exactly what a 3-token recording holds
    assert any("reused from" in line and "8 tokens recorded, 3 needed" in line for line in logs)


def test_a_longer_request_records_again_and_replaces_the_entry(tmp_path):
    rec, logs = _Recorder(), []
    G.cached_golden(tmp_path, _key(), 4, rec, log=logs.append)
    g, reused = G.cached_golden(tmp_path, _key(), 6, rec, log=logs.append)
    assert not reused and rec.calls == [4, 6] and g["num_tokens"] == 6
    assert any("holds 4 tokens, 6 needed" in line for line in logs)
    G.cached_golden(tmp_path, _key(), 4, rec, log=logs.append)
    assert rec.calls == [4, 6]  # the 6-token entry serves 4


def test_other_key_misses_and_a_corrupted_entry_is_recorded_again(tmp_path):
    rec, logs = _Recorder(), []
    G.cached_golden(tmp_path, _key(), 4, rec, log=logs.append)
    G.cached_golden(tmp_path, _key(precision="int4"), 4, rec, log=logs.append)
    assert rec.calls == [4, 4]
    G.cache_path(tmp_path, _key()).write_text("{not json")
    g, reused = G.cached_golden(tmp_path, _key(), 4, rec, log=logs.append)
    assert not reused and rec.calls == [4, 4, 4] and g == _fake_recording(4)
    assert any("is not usable" in line for line in logs)


def test_truncate_refuses_more_tokens_than_recorded():
    with pytest.raises(ValueError, match="4-token recording cannot serve 5"):
        G.truncate_golden(_fake_recording(4), 5)


def test_model_content_hash_is_content_not_name_or_mtime(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b" / "a.gguf"
    b.parent.mkdir()
    a.write_bytes(b"x" * 100)
    b.write_bytes(b"x" * 100)
    assert G.model_content_sha256(a) == G.model_content_sha256(b)
    b.write_bytes(b"x" * 99 + b"y")
    assert G.model_content_sha256(a) != G.model_content_sha256(b)


# ----------------------------------------------------------------------------------------------
# the real reference on a 2-layer SmolLM2
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref_2layer(gguf_path):
    from trtpipe.pipeline.model.gguf import load_gguf
    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.model.weights import LoadedModel

    m = load_gguf(gguf_path)
    c = dataclasses.replace(
        m.config,
        num_layers=2,
        layer_num_kv_heads=m.config.layer_num_kv_heads[:2],
        layer_sliding_window=m.config.layer_sliding_window[:2],
    )
    w = {k: v for k, v in m.weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2}
    loaded = LoadedModel(c, w, m.source_path, m.source_kind, m.tokenizer_json)
    return loaded, build_reference_model(loaded, "fp32", rope_table_len=256)


@pytest.mark.slow
def test_n_tokens_of_a_longer_recording_are_bit_exact(ref_2layer):
    loaded, ref = ref_2layer
    rec = lambda n: G.record_golden(
        ref,
        loaded.tokenizer_json,
        loaded.config.chat_template,
        n,  # noqa: E731
        prompts=(G.GoldenPrompt("What is the capital of France?"), G.GoldenPrompt("Once upon a time", chat=False)),
    )
    short, long = rec(5), rec(12)
    assert G.truncate_golden(long, 5) == short  # ids, top-5 logits and margins, float for float
    assert len(long["sequences"][0]["output_ids"]) > 5
    chat, raw = long["sequences"]
    assert (chat["chat"], raw["chat"]) == (True, False)
    assert len(chat["prompt_ids"]) == 37  # templated (TOOLCHAIN.md); the raw prompt is its 4 words
    from tokenizers import Tokenizer

    assert raw["prompt_ids"] == Tokenizer.from_str(loaded.tokenizer_json).encode("Once upon a time").ids
    for s in long["sequences"]:
        assert s["top2_margin"] == [round(t[0][1] - t[1][1], 6) for t in s["top5"]]
        assert all(m >= 0 for m in s["top2_margin"])


@pytest.mark.slow
def test_recording_logs_each_prompt_and_token_progress(ref_2layer):
    loaded, ref = ref_2layer
    logs: list[str] = []
    G.record_golden(
        ref,
        loaded.tokenizer_json,
        loaded.config.chat_template,
        4,
        prompts=G.GOLDEN_PROMPTS[:2],
        log=logs.append,
        progress_every_s=0,
    )
    assert logs[0].startswith("golden prompt 1/2 (") and "up to 4 new" in logs[0]
    assert any(line.startswith("  golden prompt 1/2: 1/4 tokens,") and "tokens/s" in line for line in logs)
    assert any(line.startswith("  golden prompt 2/2: 3/4 tokens,") for line in logs)
    assert any(line.startswith("  golden prompt 2/2: 4 tokens in") for line in logs)
    assert G.golden_key(loaded).layer_sliding_window == (0, 0)
    assert G.golden_key(loaded, 64).layer_sliding_window == (64, 64)
    assert G.golden_key(loaded).digest() != G.golden_key(loaded, 64).digest()


@pytest.mark.slow
def test_a_prompt_of_an_exact_token_count_is_the_texts_first_ids(ref_2layer):
    loaded, ref = ref_2layer
    from tokenizers import Tokenizer

    text = G.BASE_GOLDEN_PROMPTS[-1].text
    full = Tokenizer.from_str(loaded.tokenizer_json).encode(text).ids
    rec = G.record_golden(
        ref, loaded.tokenizer_json, None, 2, prompts=(G.GoldenPrompt(text, chat=False, num_tokens=40),)
    )
    assert rec["sequences"][0]["prompt_ids"] == full[:40] and len(full) > 40
    with pytest.raises(ValueError, match="at least num_tokens=100000"):
        G.record_golden(ref, loaded.tokenizer_json, None, 1, prompts=(G.GoldenPrompt("short", False, 100000),))


def test_base_golden_set_has_long_and_window_edge_prompts():
    """Issue 42's base set: >= 16 raw completions, >= 4 past a 512-token window, 511/512/513."""
    base = G.GOLDEN_SETS["base"]
    lengths = [p.num_tokens for p in base if p.num_tokens is not None]
    assert len(base) >= 16 and not any(p.chat for p in base)
    assert sum(n > 600 for n in lengths) >= 4 and {511, 512, 513} <= set(lengths)
    assert G.GOLDEN_SETS["default"] == G.GOLDEN_PROMPTS
