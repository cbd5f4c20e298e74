"""The golden prompts: the README's and docs' examples and prompts of the kinds validate serves
(:data:`GOLDEN_PROMPTS`, the ``default`` set), and the ``base`` set for pretrained models without a
chat template, with prompts past a 512-token sliding window and at its edge (:data:`BASE_GOLDEN_PROMPTS`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trtpipe.runtime.measure.workload_corpus import CORPUS


@dataclass(frozen=True)
class GoldenPrompt:
    """One golden prompt: ``text``, chat-templated (one user turn) when ``chat`` and the model
    has a template, else fed as raw text (a completion). ``num_tokens``: when set, the prompt is
    the first ``num_tokens`` ids (BOS included) of the tokenized text, which must hold at least
    that many (a prompt of an exact length whatever the tokenizer)."""

    text: str
    chat: bool = True
    num_tokens: int | None = None


# The golden set: the README's and docs' example prompts (chat-templated where they are) and
# prompts of the kinds the validate scenarios serve (questions, code, lists, summaries, raw
# completions). validate compares the artifact with the fp32 reference over all of them.
GOLDEN_PROMPTS = (
    GoldenPrompt("What is the capital of France?"),  # README: generate, chat, the openai snippet
    GoldenPrompt("Why is the sky blue?"),  # README: generate from stdin
    GoldenPrompt("Tell me a story."),  # README: LLM.stream
    GoldenPrompt("Once upon a time", chat=False),  # README: completions stream
    GoldenPrompt("The capital of France is", chat=False),  # tests, /tokenize example
    GoldenPrompt("Write a Python function that returns the n-th Fibonacci number."),
    GoldenPrompt("Explain in two sentences why the sky is blue."),
    GoldenPrompt("List three uses of a paperclip."),
    GoldenPrompt("def fibonacci(n):", chat=False),
    GoldenPrompt("Once upon a time, in a land far away,", chat=False),
    GoldenPrompt("Translate 'good morning' into Spanish."),
    GoldenPrompt("What is 12 times 7?"),
    GoldenPrompt("Summarize the plot of Romeo and Juliet in one paragraph."),
    GoldenPrompt("Give me three tips for writing clean code."),
    GoldenPrompt("Write a haiku about the ocean."),
    GoldenPrompt("How do I reverse a list in Python?"),
    GoldenPrompt("The first lighthouses were not towers at all but", chat=False),
    GoldenPrompt("What are the symptoms of the common cold?"),
)


def _rotated_corpus(first_paragraph: int) -> str:
    """The prompt corpus (~1,050 Gemma tokens) starting at its paragraph ``first_paragraph``, the
    earlier paragraphs after it, twice over: long natural prose, a different text per start."""
    paras = CORPUS.strip().split("\n\n")
    text = "\n\n".join(paras[first_paragraph:] + paras[:first_paragraph])
    return text + "\n\n" + text


# The base set: raw completions (a pretrained model has no chat template), four prompts past a
# 512-token window (the window layers then attend over a part of the prompt only) and three at
# its edge (511, 512, 513 tokens: the first generated token sees exactly W-1, W and W+1
# positions). Lengths count the BOS token. 19 prompts x 64 tokens.
BASE_GOLDEN_PROMPTS = (
    GoldenPrompt("The capital of France is", chat=False),
    GoldenPrompt("Once upon a time", chat=False),
    GoldenPrompt("Once upon a time, in a land far away,", chat=False),
    GoldenPrompt("def fibonacci(n):", chat=False),
    GoldenPrompt("The first lighthouses were not towers at all but", chat=False),
    GoldenPrompt("The three primary colors are", chat=False),
    GoldenPrompt("import numpy as np\n\n# Compute the mean of each column of a matrix\n", chat=False),
    GoldenPrompt("Water boils at a temperature of", chat=False),
    GoldenPrompt("Question: What is 12 times 7?\nAnswer:", chat=False),
    GoldenPrompt("My grandmother's recipe for apple pie begins with", chat=False),
    GoldenPrompt("In 1969, the first humans to walk on the Moon", chat=False),
    GoldenPrompt("The most important rule of writing clean code is", chat=False),
    GoldenPrompt(_rotated_corpus(0), chat=False, num_tokens=640),
    GoldenPrompt(_rotated_corpus(2), chat=False, num_tokens=700),
    GoldenPrompt(_rotated_corpus(4), chat=False, num_tokens=850),
    GoldenPrompt(_rotated_corpus(6), chat=False, num_tokens=1000),
    GoldenPrompt(_rotated_corpus(1), chat=False, num_tokens=511),
    GoldenPrompt(_rotated_corpus(3), chat=False, num_tokens=512),
    GoldenPrompt(_rotated_corpus(5), chat=False, num_tokens=513),
)

GoldenSet = Literal["default", "base"]

GOLDEN_SETS: dict[str, tuple[GoldenPrompt, ...]] = {"default": GOLDEN_PROMPTS, "base": BASE_GOLDEN_PROMPTS}


__all__ = ["BASE_GOLDEN_PROMPTS", "GOLDEN_PROMPTS", "GOLDEN_SETS", "GoldenPrompt", "GoldenSet"]
