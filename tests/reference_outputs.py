"""What the fp32 reference answers, for tests that assert a greedy output.

A test that checks a greedy text checks it against the fp32 torch reference's recording for the
artifact under test (``golden.json``, written by the build from pipeline/stages/golden.py's prompts), not
against a string one host happened to print. The artifact's promise (recipe
``validate.correctness``): the first generated token equals the reference's; later tokens equal
it until the first position where the reference's own top-2 margin is below the tie threshold,
where rounding may pick the runner-up and the texts part.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

TIE_THRESHOLD_LOGITS = 0.25  # the default recipe's validate.correctness.tie_threshold_logits


def golden_sequence(artifact: Path, prompt: str, chat: bool = True) -> dict:
    """The golden sequence of ``prompt`` in ``artifact``'s golden.json (KeyError naming the
    prompts it holds when absent)."""
    golden = json.loads((Path(artifact) / "golden.json").read_text(encoding="utf-8"))
    for s in golden["sequences"]:
        if s["prompt"] == prompt and bool(s.get("chat", True)) == chat:
            return s
    raise KeyError(
        f"{prompt!r} (chat={chat}) is not a golden prompt of {artifact}: {[s['prompt'] for s in golden['sequences']]}"
    )


def guaranteed_length(seq: dict, tie: float = TIE_THRESHOLD_LOGITS) -> int:
    """How many leading reference tokens a faithful artifact must reproduce: the first token
    always, then every token up to (not including) the first later near-tie (margin < ``tie``)."""
    margins = seq["top2_margin"]
    for i in range(1, len(margins)):
        if margins[i] < tie:
            return i
    return len(seq["output_ids"])


def assert_follows_reference(got: Sequence[int], seq: dict, tie: float = TIE_THRESHOLD_LOGITS) -> None:
    """``got`` (greedy ids, possibly cut by a token limit) starts as the reference does: the
    first token equal, and the first later difference only where the reference margin < ``tie``."""
    want, margins = [int(t) for t in seq["output_ids"]], seq["top2_margin"]
    assert got and got[0] == want[0], f"first token {got[:1]} != reference {want[:1]} (margin {margins[0]:.3f})"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            assert margins[i] < tie, f"token {i}: {g} != reference {w} at reference margin {margins[i]:.3f} >= {tie}"
            return
    n = min(len(got), len(want))
    if len(got) != len(want) and n < len(got) and n < len(want):
        raise AssertionError(f"lengths differ at {n} without a differing token")


def reference_text(artifact: Path, prompt: str, chat: bool = True, max_tokens: int | None = None) -> str:
    """The reference's greedy text for ``prompt`` (EOS and other special tokens dropped), cut to
    ``max_tokens`` tokens, detokenized with the artifact's own tokenizer."""
    from tokenizers import Tokenizer

    seq = golden_sequence(artifact, prompt, chat)
    ids = seq["output_ids"][:max_tokens]
    return Tokenizer.from_file(str(Path(artifact) / "tokenizer.json")).decode(ids, skip_special_tokens=True)


def guaranteed_text(artifact: Path, prompt: str, chat: bool = True, max_tokens: int | None = None) -> str:
    """The part of :func:`reference_text` every faithful artifact prints (see
    :func:`guaranteed_length`): equal to the whole text when the reference has no later near-tie."""
    seq = golden_sequence(artifact, prompt, chat)
    n = guaranteed_length(seq)
    return reference_text(artifact, prompt, chat, min(n, max_tokens or n))


def assert_text_follows_reference(
    text: str, artifact: Path, prompt: str, chat: bool = True, max_tokens: int | None = None
) -> None:
    """``text`` (a greedy answer of at most ``max_tokens`` tokens) starts with what every faithful
    artifact prints, and is the whole reference text when the reference has no later near-tie."""
    full = reference_text(artifact, prompt, chat, max_tokens)
    must = guaranteed_text(artifact, prompt, chat, max_tokens)
    assert text.startswith(must), f"{text!r} does not start with the reference's {must!r} (full: {full!r})"
    if must == full:
        assert text == full, f"{text!r} != the reference's {full!r}"
