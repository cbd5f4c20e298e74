"""Correctness probes against golden outputs: teacher-forced argmax agreement and greedy ids.

Teacher forcing (the usual way to compare a quantized model with its reference without letting
one early disagreement change everything after it): feed the *reference* continuation token by
token and, at each position, compare the engine's argmax with the reference's next token::

    prompt p0..pn-1 ──prefill──► logits ─argmax─► pred[0]  vs target[0]
    target[0]       ──decode───► logits ─argmax─► pred[1]  vs target[1]
    ...
    target[m-2]     ──decode───► logits ─argmax─► pred[m-1] vs target[m-1]

agreement = (number of i with pred[i] == target[i]) / m. The prefill engine makes the first
prediction and the decode engine every later one, so a recipe with INT4 decode is measured
mostly on its INT4 path.

The probe runs the engines directly on a private sequence of the LLM's KV pool (it does not go
through the scheduler), so call it between ``LLM.step`` calls, never in the middle of one. Its
blocks are freed at the end, also on error.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM

_probe_ids = itertools.count()


def teacher_forced_agreement(llm: LLM, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> tuple[float, list[int]]:
    """Teacher-force ``target_ids`` after ``prompt_ids``; return (agreement, predicted ids).

    Returns the fraction of positions where the engine's argmax equals the target (0..1) and the
    ``len(target_ids)`` argmax ids (of :func:`teacher_forced_logits`, which says what it runs and raises).
    """
    preds = [int(i) for i in np.argmax(teacher_forced_logits(llm, prompt_ids, target_ids), axis=-1)]
    agree = sum(p == t for p, t in zip(preds, target_ids))
    return agree / len(preds), preds


def teacher_forced_logits(llm: LLM, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> np.ndarray:
    """``[len(target_ids), V]`` float32: the engine's logits for each target position, fed the
    targets before it (row 0 from the prefill of the prompt, row i from decoding target i - 1).

    ``llm``: an :class:`~trtpipe.runtime.llm.LLM` (uses its ``engine``, ``kv_manager`` and the
    manifest's ``max_num_tokens`` / ``max_seq_len``). The prompt is prefilled in chunks of at most
    ``max_num_tokens`` tokens; then each target token but the last is decoded one at a time.

    Raises :class:`RequestError` for an empty prompt or target, a sequence longer than
    ``max_seq_len``, or a KV pool too full to hold it.
    """
    prompt = [int(t) for t in prompt_ids]
    target = [int(t) for t in target_ids]
    if not prompt or not target:
        raise RequestError(
            f"teacher forcing needs a non-empty prompt and target (got {len(prompt)} "
            f"prompt and {len(target)} target tokens). Fix: check golden.json."
        )
    max_seq_len, chunk = llm.manifest.limits.max_seq_len, llm.manifest.limits.max_num_tokens
    total = len(prompt) + len(target) - 1  # the last target token is never fed
    if total > max_seq_len:
        raise RequestError(
            f"teacher forcing: {len(prompt)} prompt + {len(target) - 1} fed target "
            f"tokens = {total} > max_seq_len {max_seq_len}. Fix: use a shorter "
            "reference or a recipe with a larger max_seq_len."
        )
    kv = llm.kv_manager
    seq_id = f"teacher-forcing-{next(_probe_ids)}"

    def allocate(num_new: int, num_computed: int) -> None:
        if not kv.allocate_slots(seq_id, num_new, num_computed):
            raise RequestError(
                f"teacher forcing: the KV pool has no room for {num_new} more tokens "
                f"({kv.block_pool.num_free} free blocks). Fix: run it when no "
                "request is running, or give the pool more blocks."
            )

    rows: list[np.ndarray] = []
    try:
        pos = 0
        logits: np.ndarray | None = None
        while pos < len(prompt):
            n = min(chunk, len(prompt) - pos)
            allocate(n, pos)
            chunk_rec = ScheduledPrefill(
                seq_id,
                tuple(prompt[pos : pos + n]),
                pos,
                tuple(kv.block_table(seq_id)),
                tuple(kv.slot_mapping(seq_id, pos, n)),
                pos + n == len(prompt),
            )
            logits = llm.engine.prefill(PrefillBatch.from_scheduled([chunk_rec]))  # [1, V]
            pos += n
        assert logits is not None  # the prompt is non-empty (checked above)
        rows.append(np.asarray(logits, np.float32)[0])
        for tok in target[:-1]:
            allocate(1, pos)
            rec = ScheduledDecode(seq_id, tok, pos, tuple(kv.block_table(seq_id)), kv.slot_mapping(seq_id, pos, 1)[0])
            logits = llm.engine.decode(DecodeBatch.from_scheduled([rec]))  # [1, V]
            rows.append(np.asarray(logits, np.float32)[0])
            pos += 1
    finally:
        kv.free(seq_id)
    return np.stack(rows)


def greedy_ids(llm: LLM, prompt_ids: Sequence[int], n: int) -> list[int]:
    """Greedy (argmax) continuation of ``prompt_ids``: at most ``n`` ids, stopping at EOS like the
    golden outputs do. Runs through ``llm.generate`` (scheduler, prefill and decode engines)."""
    out = llm.generate([list(int(t) for t in prompt_ids)], SamplingParams(max_new_tokens=n))[0]
    if out.finish_reason == "error":
        raise RequestError(f"greedy generation failed: {out.error_message}")
    return list(out.output_token_ids)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts at
    the shorter length); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


__all__ = ["first_mismatch", "greedy_ids", "teacher_forced_agreement"]
