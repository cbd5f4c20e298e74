"""Log-probabilities of the sampled tokens and the most likely alternatives, per row.

``raw`` mode (the default, vLLM's ``raw_logprobs``): a log-softmax over the full vocabulary of
the engine's fp32 logits, before bias, penalties, the grammar mask and temperature. ``processed``
mode (vLLM's ``processed_logprobs``): the same over the logits the token was drawn from (after
bias, penalties, the grammar mask and temperature; top-k/top-p not applied), so a masked token
has -inf.

    log_softmax(x)[t] = x[t] - max(x) - log(sum(exp(x - max(x))))     (float32, per row)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtpipe.runtime.errors import RequestError

LOGPROBS_MODES = ("raw", "processed")


def check_logprobs_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`LOGPROBS_MODES`, else :class:`RequestError` with the fix."""
    if mode not in LOGPROBS_MODES:
        raise RequestError(
            f"logprobs_mode = {mode!r}: expected one of {list(LOGPROBS_MODES)}. Fix: pass 'raw' (the "
            "engine's logits) or 'processed' (after bias, penalties, the grammar mask and temperature)."
        )
    return mode


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token: its log-probability and the ``top`` most likely tokens (ids and
    log-probabilities, most likely first; ties by lower id). Natural log, float."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def log_softmax(x: np.ndarray) -> np.ndarray:
    """``[S, V]`` float32 log-softmax per row (-inf entries stay -inf)."""
    x = np.asarray(x, dtype=np.float32)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def top_logprobs(logprobs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each row of ``[S, V]`` log-probabilities: ``(ids [S, k] int64,
    values [S, k] float32)``, best first, ties broken by the lower token id (a stable order)."""
    num_rows, vocab = logprobs.shape
    k = min(k, vocab)
    if k == 0:
        return np.zeros((num_rows, 0), np.int64), np.zeros((num_rows, 0), np.float32)
    part = np.argpartition(-logprobs, k - 1, axis=-1)[:, :k]  # [S, k] unordered
    vals = np.take_along_axis(logprobs, part, axis=-1)
    order = np.lexsort((part, -vals), axis=-1)  # value descending, then id ascending
    ids = np.take_along_axis(part, order, axis=-1)
    return ids.astype(np.int64), np.take_along_axis(vals, order, axis=-1)


def gather(logprobs: np.ndarray, token_ids: np.ndarray, num_top: Sequence[int]) -> list[TokenLogprobs]:
    """Records for ``S`` rows: the sampled ``token_ids [S]`` and ``num_top[i]`` alternatives."""
    chosen = logprobs[np.arange(len(token_ids)), token_ids]
    ids, vals = top_logprobs(logprobs, max(num_top, default=0))
    return [
        TokenLogprobs(int(t), float(c), tuple(int(x) for x in ids[i, :n]), tuple(float(x) for x in vals[i, :n]))
        for i, (t, c, n) in enumerate(zip(token_ids.tolist(), chosen.tolist(), num_top))
    ]


__all__ = ["LOGPROBS_MODES", "check_logprobs_mode", "TokenLogprobs", "gather", "log_softmax", "top_logprobs"]
