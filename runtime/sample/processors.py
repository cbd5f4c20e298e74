"""Logits processors: logit bias, penalties, ``min_tokens`` and the grammar mask, over a whole
``[S, V]`` batch at once (NumPy; no Python loop over the vocabulary).

Order, as DESIGN.md's sampling contract and vLLM v1's sampler: logit bias, then penalties
(repetition, frequency, presence), ``min_tokens`` (EOS and stop tokens to -inf), the grammar
mask (disallowed tokens to -inf); temperature/top-k/top-p follow in the sampler.

Penalties follow vLLM's ``apply_penalties`` (and OpenAI's definitions)::

    repetition (tokens seen in prompt or output):  logit > 0 -> logit / r,  logit <= 0 -> logit * r
    frequency (output tokens):                     logit -= frequency_penalty * count(token)
    presence  (output tokens):                     logit -= presence_penalty * (count(token) > 0)

Token counts come from one ``np.bincount`` over the concatenated histories of the penalised rows
(index ``row * V + token``), so the work is O(rows x V) in NumPy whatever the row count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from trtpipe.runtime.sample.params import SamplingParams


def needs_processing(params: SamplingParams, num_output_tokens: int) -> bool:
    """True when some processor changes this row's logits."""
    return bool(params.logit_bias or params.has_penalties or num_output_tokens < params.min_tokens)


def apply_logit_bias(logits: np.ndarray, params: Sequence[SamplingParams]) -> None:
    """Add each row's ``logit_bias`` in place. ``logits``: ``[S, V]`` float32."""
    rows = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
    if not rows:
        return
    r, t, b = (np.array(x) for x in zip(*rows))
    np.add.at(logits, (r.astype(np.int64), t.astype(np.int64)), b.astype(logits.dtype))


def token_counts(histories: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """``[len(histories), V]`` int64: how often each token occurs in each history."""
    if not histories:
        return np.zeros((0, vocab_size), dtype=np.int64)
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    flat = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories] + [np.zeros(0, np.int64)])
    rows = np.repeat(np.arange(len(histories), dtype=np.int64), lengths)
    counts = np.bincount(rows * vocab_size + flat, minlength=len(histories) * vocab_size)
    return counts.reshape(len(histories), vocab_size)


def apply_penalties(
    logits: np.ndarray,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> None:
    """Repetition, frequency and presence penalties in place, for the rows that have them.

    Args:
        logits: ``[S, V]`` float32 (modified in place).
        params, prompts, outputs: ``S`` sampling parameters, prompt token ids, output token ids.
    """
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return
    vocab = logits.shape[1]
    sub = logits[rows]  # [R, V] copy
    out_counts = token_counts([outputs[i] for i in rows], vocab)  # [R, V]
    rep = np.array([params[i].repetition_penalty for i in rows], dtype=np.float32)[:, None]
    if (rep != 1.0).any():
        seen = (token_counts([prompts[i] for i in rows], vocab) > 0) | (out_counts > 0)
        scaled = np.where(sub > 0, sub / rep, sub * rep)
        sub = np.where(seen, scaled, sub)
    freq = np.array([params[i].frequency_penalty for i in rows], dtype=np.float32)[:, None]
    pres = np.array([params[i].presence_penalty for i in rows], dtype=np.float32)[:, None]
    sub = sub - freq * out_counts.astype(np.float32) - pres * (out_counts > 0).astype(np.float32)
    logits[rows] = sub


def apply_min_tokens(
    logits: np.ndarray, params: Sequence[SamplingParams], num_outputs: Sequence[int], eos_token_ids: Iterable[int]
) -> None:
    """While a row has fewer than ``min_tokens`` outputs, its stop tokens (EOS unless
    ``ignore_eos``, and ``stop_token_ids``) get -inf, in place (vLLM's MinTokensLogitsProcessor)."""
    eos = tuple(eos_token_ids)
    pairs = [
        (i, t)
        for i, (p, n) in enumerate(zip(params, num_outputs))
        if n < p.min_tokens
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
    ]
    if pairs:
        r, t = (np.array(x, dtype=np.int64) for x in zip(*pairs))
        logits[r, t] = -np.inf


# byte value -> the 8 additive masks of its bits (0.0 where the bit is set, -inf where not): one
# gather turns a bitmask row into an additive [V] mask, ~3x faster than unpackbits + np.where
_BYTE_TO_MASK = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool), 0.0, -np.inf
).astype(np.float32)  # [256, 8]


def apply_bitmask(logits: np.ndarray, bitmask: np.ndarray, rows: np.ndarray) -> None:
    """Set -inf where a constrained row's bit is 0, in place.

    Args:
        logits: ``[S, V]`` float32.
        bitmask: ``[S, ceil(V / 32)]`` int32, llguidance's layout (bit ``t % 32`` of word
            ``t // 32`` is 1 when token t is allowed; little-endian words, so byte ``t // 8``
            holds bit ``t % 8``).
        rows: ``[R]`` int64 indices of the constrained rows (the others are left alone).
    """
    if len(rows) == 0:
        return
    vocab = logits.shape[1]
    words = np.ascontiguousarray(bitmask[rows]).view(np.uint8)  # [R, 4 * W]
    additive = _BYTE_TO_MASK[words].reshape(len(rows), -1)[:, :vocab]  # [R, V] 0 or -inf
    logits[rows] += additive


__all__ = [
    "apply_bitmask",
    "apply_logit_bias",
    "apply_min_tokens",
    "apply_penalties",
    "needs_processing",
    "token_counts",
]
