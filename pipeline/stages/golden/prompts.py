"""The golden prompts: the README's and docs' examples and prompts of the kinds validate serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GoldenPrompt:
    """One golden prompt: ``text``, chat-templated (one user turn) when ``chat`` and the model
    has a template, else fed as raw text (a completion)."""

    text: str
    chat: bool = True


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


__all__ = ["GOLDEN_PROMPTS", "GoldenPrompt"]
