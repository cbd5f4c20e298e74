"""Workloads with a shared system prompt (the `assistant` scenario): every prompt starts with the
same tokens, in the chat template when asked."""

import pytest

from trtpipe.runtime.measure.workload import WorkloadError, WorkloadSpec, make_workload


class WordTok:
    """One token per word; ids are positions in a growing vocabulary (decode inverts encode)."""

    def __init__(self):
        self.vocab, self.words = {}, []

    def encode(self, text, add_special_tokens=True):
        return [self._id(w) for w in text.split()]

    def _id(self, w):
        if w not in self.vocab:
            self.vocab[w] = len(self.words)
            self.words.append(w)
        return self.vocab[w]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.words[i] for i in ids)


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </{{ m['role'] }}> {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _spec(**kw):
    base = dict(
        name="assistant",
        num_requests=6,
        num_warmup_requests=1,
        output_tokens=(4, 4),
        prompt_tokens=(3, 9),
        arrival_rate_per_s=1.0,
        seed=4,
        system_prompt_tokens=20,
    )
    return WorkloadSpec(**{**base, **kw})


def test_every_prompt_starts_with_the_same_system_prompt():
    tok = WordTok()
    items = make_workload(_spec(), tok)
    system = tuple(tok.encode(" ".join(tok.decode([i]) for i in items[0].prompt_ids[:20])))
    for it in items:
        assert it.prompt_ids[:20] == system
        assert 3 <= len(it.prompt_ids) - 20 <= 9  # the drawn user turn follows


def test_chat_template_wraps_system_prompt_and_user_turn():
    tok = WordTok()
    items = make_workload(_spec(chat=True), tok, chat_template=TEMPLATE)
    texts = [tok.decode(it.prompt_ids) for it in items]
    head = texts[0].split("</system>")[0]
    assert head.startswith("<system> ") and len(head.split()) == 21  # tag + 20 system tokens
    for t in texts:
        assert t.startswith(head + "</system> <user> ") and t.endswith("</user> <assistant>")
    with pytest.raises(WorkloadError, match="no chat template"):
        make_workload(_spec(chat=True), tok, chat_template=None)


def test_check_chat_template_refuses_only_chat_without_a_template():
    from trtpipe.runtime.measure.workload import check_chat_template

    with pytest.raises(WorkloadError, match="no chat template .* Fix: set chat: false"):
        check_chat_template(_spec(chat=True), None)
    check_chat_template(_spec(chat=False), None)
    check_chat_template(_spec(chat=True), TEMPLATE)
