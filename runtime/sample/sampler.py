"""Next-token sampling from logits: greedy, temperature, top-k, top-p, a generator per request.

Semantics follow the Hugging Face logits warpers, applied in the order ``generate`` uses:
``TemperatureLogitsWarper`` (divide by T), ``TopKLogitsWarper`` (keep every token whose logit is
>= the k-th largest, so ties at the boundary survive), ``TopPLogitsWarper`` (sort ascending,
drop the tokens whose cumulative probability is <= 1 - top_p, always keep the most likely one:
the smallest set with mass >= top_p), then one categorical draw.

Greedy rows (temperature 0) take the argmax of the raw logits: no softmax, no random number,
the fast path for the common case. Sampling rows draw one uniform number from their own
``np.random.Generator`` (``make_generator`` seeds it from ``SamplingParams.seed``), so a seeded
request reproduces its tokens whatever else shares the batch.

:func:`sample_rows` is the step's full path (DESIGN.md's sampling contract)::

    raw logits [S, V] ──(rows asking logprobs, raw mode)──► log_softmax ──► TokenLogprobs
        └─► logit bias, penalties, min_tokens, grammar mask (processors, whole batch) ──► argmax / draw
                                                       └─(processed mode)──► log_softmax(x / T)

Rows that need no processing are not copied. A row whose every token is masked (a grammar and
``min_tokens`` that contradict) degenerates to its raw argmax rather than failing the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from trtpipe.runtime.sample import processors
from trtpipe.runtime.sample.logprobs import TokenLogprobs, gather, log_softmax
from trtpipe.runtime.sample.params import SamplingParams

_fallback_rng = np.random.default_rng()


def make_generator(params: SamplingParams) -> np.random.Generator:
    """The per-request generator: ``np.random.default_rng(params.seed)`` (OS entropy if None)."""
    return np.random.default_rng(params.seed)


def sample(
    logits: np.ndarray, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator | None]
) -> np.ndarray:
    """Pick one token per row.

    Args:
        logits: ``[S, V]`` float (float32 expected; float16 is upcast), one row per sequence.
        params: ``S`` sampling parameters (validated upstream).
        generators: ``S`` generators; None uses a process-wide unseeded one.

    Returns:
        ``[S]`` int64 token ids.
    """
    logits = np.asarray(logits)
    assert logits.ndim == 2, f"logits must be [S, V], got shape {logits.shape}"
    num_rows = logits.shape[0]
    assert len(params) == num_rows and len(generators) == num_rows, (
        f"{num_rows} logit rows but {len(params)} params and {len(generators)} generators"
    )
    token_ids = np.empty(num_rows, dtype=np.int64)
    greedy = np.fromiter((p.temperature == 0.0 for p in params), dtype=bool, count=num_rows)
    if greedy.any():
        token_ids[greedy] = np.argmax(logits[greedy], axis=-1)
    for row in np.flatnonzero(~greedy).tolist():
        rng = generators[row] if generators[row] is not None else _fallback_rng
        token_ids[row] = _sample_row(logits[row], params[row], rng)
    return token_ids


@dataclass(frozen=True, slots=True)
class SampleRow:
    """What the sampler needs of one row: its parameters, generator and token history."""

    params: SamplingParams
    rng: np.random.Generator | None
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()


def sample_rows(
    logits: np.ndarray,
    rows: Sequence[SampleRow],
    *,
    eos_token_ids: Iterable[int] = (),
    bitmask: np.ndarray | None = None,
    constrained: np.ndarray | None = None,
    logprobs_mode: str = "raw",
) -> tuple[np.ndarray, list[TokenLogprobs | None]]:
    """Pick one token per row after bias, penalties, ``min_tokens`` and the grammar mask.

    Args:
        logits: ``[S, V]`` float32 raw engine logits, one row per sequence.
        rows: ``S`` :class:`SampleRow` (params validated upstream).
        eos_token_ids: the model's EOS ids (masked under ``min_tokens``).
        bitmask: ``[S, ceil(V / 32)]`` int32 llguidance token bitmask, or None.
        constrained: ``[R]`` int64 rows that ``bitmask`` applies to (None: none).
        logprobs_mode: "raw" (log-softmax of ``logits``) or "processed" (of what was sampled from).

    Returns:
        ``(token_ids [S] int64, logprobs)``: one :class:`TokenLogprobs` per row that asked
        ``params.logprobs`` (None for the others).
    """
    logits = np.asarray(logits, dtype=np.float32)
    params = [r.params for r in rows]
    x = processed_logits(logits, rows, eos_token_ids=eos_token_ids, bitmask=bitmask, constrained=constrained)
    token_ids = sample(x, params, [r.rng for r in rows])
    return token_ids, logprob_records(logits, x, token_ids, params, logprobs_mode)


def processed_logits(
    logits: np.ndarray,
    rows: Sequence[SampleRow],
    *,
    eos_token_ids: Iterable[int] = (),
    bitmask: np.ndarray | None = None,
    constrained: np.ndarray | None = None,
) -> np.ndarray:
    """``[S, V]`` float32 logits after bias, penalties, ``min_tokens`` and the grammar mask (the
    arguments as :func:`sample_rows`); ``logits`` itself when no row needs processing. What a
    row samples from before temperature/top-k/top-p (also the speculative verifier's target)."""
    params = [r.params for r in rows]
    rows_c = np.zeros(0, np.int64) if constrained is None else np.asarray(constrained, np.int64)
    touched = [i for i, r in enumerate(rows) if processors.needs_processing(r.params, len(r.output_token_ids))]
    if not touched and not len(rows_c):
        return logits
    x = logits.copy()
    processors.apply_logit_bias(x, params)
    processors.apply_penalties(x, params, [r.prompt_token_ids for r in rows], [r.output_token_ids for r in rows])
    processors.apply_min_tokens(x, params, [len(r.output_token_ids) for r in rows], eos_token_ids)
    if bitmask is not None:
        processors.apply_bitmask(x, bitmask, rows_c)
    dead = ~np.isfinite(x.max(axis=-1))
    x[dead] = logits[dead]  # an all-masked row: fall back to the raw logits
    return x


def logprob_records(
    logits: np.ndarray, x: np.ndarray, token_ids: np.ndarray, params: Sequence[SamplingParams], logprobs_mode: str
) -> list[TokenLogprobs | None]:
    """One :class:`TokenLogprobs` per row that asked ``logprobs`` (None for the others): of the raw
    ``logits`` ("raw") or of the processed ``x`` over the temperature ("processed"); ``token_ids``:
    the tokens chosen per row."""
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(params)
    if not want:
        return out
    if logprobs_mode == "raw":
        lp = log_softmax(logits[want])
    else:
        temps = np.array([params[i].temperature or 1.0 for i in want], np.float32)[:, None]
        lp = log_softmax(x[want] / temps)
    for i, rec in zip(want, gather(lp, np.asarray(token_ids)[want], [params[i].logprobs or 0 for i in want])):
        out[i] = rec
    return out


def _sample_row(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One categorical draw from a ``[V]`` row after temperature, top-k and top-p."""
    token_ids, probs = filtered_distribution(logits, params)
    return draw(token_ids, probs, rng)


def draw(token_ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """One categorical draw of ``token_ids [K]`` with weights ``probs [K]`` (need not sum to 1,
    must have a positive sum), consuming one ``rng.random()``."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(token_ids[min(index, len(token_ids) - 1)])


def filtered_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The distribution a sampling row draws from (temperature > 0).

    Args:
        logits: ``[V]`` float row.
        params: temperature (> 0), top_k, top_p.

    Returns:
        ``(token_ids [K] int64, probs [K] float64)``: the tokens that survive top-k/top-p, in
        ascending id order, and their renormalized probabilities. A row without a finite
        maximum (all -inf, NaN, +inf) degenerates to its argmax with probability 1.
    """
    scores = logits.astype(np.float64) / params.temperature  # [V]
    if not np.isfinite(scores.max()):
        return np.array([np.argmax(scores)], dtype=np.int64), np.ones(1)
    vocab_size = scores.shape[0]
    candidates = np.arange(vocab_size, dtype=np.int64)  # token ids still in play
    if 0 < params.top_k < vocab_size:
        kth_largest = np.partition(scores, vocab_size - params.top_k)[vocab_size - params.top_k]
        candidates = np.flatnonzero(scores >= kth_largest)
    kept = scores[candidates]
    if params.top_p < 1.0:
        order = np.argsort(kept, kind="stable")  # ascending, as in TopPLogitsWarper
        cumulative = np.cumsum(_softmax(kept[order]))
        remove = cumulative <= 1.0 - params.top_p
        remove[-1] = False  # min_tokens_to_keep = 1
        keep = np.sort(order[~remove])
        candidates, kept = candidates[keep], kept[keep]
    return candidates, _softmax(kept)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


__all__ = [
    "SampleRow",
    "draw",
    "filtered_distribution",
    "logprob_records",
    "make_generator",
    "processed_logits",
    "sample",
    "sample_rows",
]
