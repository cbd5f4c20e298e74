"""Incremental detokenizer on a real byte-level BPE tokenizer (trained here, ~300 tokens, so
multi-byte characters are split across tokens), and the stop-string helpers."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer, find_stop, stop_prefix_len

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world!",
    "我们今天去公园散步，天气很好。中文分词是一个有趣的问题。",
    "日本語のテキストです。ひらがなとカタカナと漢字を使います。",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Emoji: 😀😃😄🎉🚀👍🏽 ❤️ 🇫🇷",
]
SAMPLES = {
    "chinese": "我们今天去公园散步，天气很好。新的句子：龍、鳥、魚！",
    "japanese": "日本語のテキストです。東京タワーへ行きましょう。",
    "emoji": "Party 🎉🚀 time 👍🏽 family 👨‍👩‍👧 flag 🇯🇵 😀",
    "cyrillic": "Привет, мир! Ёжик в тумане — щука, ъ, ь.",
    "mixed": "abc 中文 日本 Ж 😀 end",
}


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    assert tok.get_vocab_size() <= 300
    return tok


def stream(tokenizer, ids, prompt=()):
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt)
    pieces = [detok.add(t) for t in ids]
    pieces.append(detok.flush())
    return pieces, detok


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_streamed_pieces_concatenate_to_the_full_decode(tokenizer, name):
    text = SAMPLES[name]
    ids = tokenizer.encode(text).ids
    # The tokenizer really splits characters: some single token decodes to U+FFFD.
    if name != "mixed":
        assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    pieces, detok = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
    assert detok.text == text and detok.output_token_ids == ids
    assert "" in pieces[:-1]  # some tokens had to wait for the rest of their character


def test_prompt_is_context_not_output(tokenizer):
    prompt = tokenizer.encode("Привет, 我们").ids
    out = tokenizer.encode("日本語 😀!").ids
    pieces, _ = stream(tokenizer, out, prompt=prompt)
    assert "".join(pieces) == tokenizer.decode(out)
    assert all("\ufffd" not in p for p in pieces)


def test_special_tokens_are_skipped(tokenizer):
    eos = tokenizer.token_to_id("<eos>")
    ids = tokenizer.encode("中文").ids + [eos]
    pieces, _ = stream(tokenizer, ids)
    assert "".join(pieces) == "中文"
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join([detok.add(t) for t in ids] + [detok.flush()]) == "中文<eos>"


def test_a_split_character_is_emitted_only_when_complete(tokenizer):
    byte_ids = [tokenizer.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet()]
    assert None not in byte_ids
    # U+1F600 is F0 9F 98 80: feed it one byte-token at a time.
    enc = {b: tokenizer.token_to_id(_byte_char(b)) for b in "😀".encode()}
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add(enc[b]) for b in "😀".encode()] == ["", "", "", "😀"]
    # A character cut off at the end (its first byte only) never reaches the text ...
    detok.add(enc[0xF0])
    assert detok.flush() == ""
    assert detok.text == "😀"
    # ... while invalid UTF-8 inside the text stays visible as U+FFFD.
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(t) for t in (enc[0xF0], tokenizer.token_to_id("a"))] + [detok.flush()]
    assert "".join(pieces) == "\ufffda"


@pytest.mark.parametrize("name", ["chinese", "emoji"])
def test_a_token_limit_inside_a_character_never_ends_the_text_with_fffd(tokenizer, name):
    """Cut the token stream at every point where the decode ends inside a character (as
    --max-new-tokens does): the text is the complete characters before the cut, never U+FFFD at
    the end, and the ids keep every byte."""
    text = SAMPLES[name]
    ids = tokenizer.encode(text).ids
    cuts = [k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert len(cuts) >= 3  # the sample really has characters split across tokens
    for k in cuts:
        pieces, detok = stream(tokenizer, ids[:k])
        want = tokenizer.decode(ids[:k]).rstrip("\ufffd")
        assert "".join(pieces) == detok.text == want
        assert not detok.text.endswith("\ufffd") and text.startswith(detok.text)
        assert detok.output_token_ids == ids[:k]


def _byte_char(b):
    # ByteLevel's byte -> printable unicode mapping (GPT-2 bytes_to_unicode).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    return chr(dict(zip(bs, cs))[b])


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="ab 中文日本語カタ😀🎉👍🏽ЖжЁё，。!", min_size=1, max_size=40))
def test_any_text_round_trips(tokenizer, text):
    ids = tokenizer.encode(text).ids
    pieces, _ = stream(tokenizer, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_find_stop_and_holdback():
    assert find_stop("hello world", ["wor", "lo"]) == 3
    assert find_stop("hello world", ["xyz"]) is None
    assert find_stop("abcabc", ["abc"], start=1) == 3
    assert find_stop("abc", ["", "c"]) == 2
    assert find_stop("日本語です", ["語"]) == 2
    assert stop_prefix_len("the end is ne", ["near", "x"]) == 2
    assert stop_prefix_len("the end is n", ["near", "nope"]) == 1
    assert stop_prefix_len("abc", ["zz"]) == 0
    assert stop_prefix_len("ab", ["abc"]) == 2
    assert stop_prefix_len("xabc", ["abc"]) == 0  # a full stop string is find_stop's job
