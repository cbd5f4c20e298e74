"""The hand-written analysis block of a generated benchmark document (docs/benchmarks.md,
docs/serving.md): the scripts rewrite everything else and keep what lies between the markers."""

from __future__ import annotations

from pathlib import Path

ANALYSIS_END = "<!-- analysis:end -->"


def analysis_begin(script: str) -> str:
    """The opening marker, naming the script that keeps the block (``bench/peers.py``)."""
    return f"<!-- analysis:begin (kept across runs of {script}) -->"


def read_analysis(doc: Path, begin: str, end: str = ANALYSIS_END) -> str:
    """The text between ``begin`` and ``end`` in ``doc``; "" when the file or a marker is missing."""
    try:
        text = doc.read_text()
    except OSError:
        return ""
    if begin in text and end in text:
        return text.split(begin, 1)[1].split(end, 1)[0]
    return ""
