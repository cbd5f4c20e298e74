"""Verification of proposed tokens against the target model's logits: exact under greedy, the
output distribution unchanged under sampling.

A verify row of request r ran the chunk ``[t, d_1 .. d_k]`` (``t``: its last accepted token,
``d``: the proposal) through the prefill path; logits row ``j`` (``0..k``) is the target's
next-token distribution after ``d_1 .. d_j``. Every position is processed exactly as plain decode
would process it at that point (logit bias, penalties and ``min_tokens`` see the output history
``outputs + d_1 .. d_j``: :func:`~trtpipe.runtime.sample.sampler.processed_logits`), then:

* greedy (temperature 0): ``y_j = argmax`` of position j; accept ``d_{j+1}`` while it equals
  ``y_j``; the output is the accepted drafts and then ``y_a`` (the correction, or after k hits
  the bonus token). With logits that do not depend on the chunk (the native engine: bit-exact
  batch- and chunk-invariant) this is token for token the output of plain greedy decoding.
* sampling: the rejection rule of Leviathan et al. 2023 ("Fast Inference from Transformers via
  Speculative Decoding", Alg. 1) and Chen et al. 2023, with the draft distribution q a point mass
  on d (an n-gram proposal is deterministic). With p the target's filtered distribution
  (temperature, top-k, top-p: :func:`~trtpipe.runtime.sample.sampler.filtered_distribution`):
  accept d with probability ``min(1, p(d)/q(d)) = p(d)``; on rejection draw from
  ``norm(max(0, p - q))``, which for a point mass is p with d removed and renormalized. Then for
  any token x: ``P(x) = [x = d] p(d) + (1 - p(d)) * [x != d] p(x) / (1 - p(d)) = p(x)``: each emitted
  token is distributed exactly as a plain sampled step would draw it. After k acceptances the
  bonus token is drawn from p at position k. The draws come from the request's own generator, so
  a seeded request reproduces its tokens run after run, though not the tokens of a run without
  speculation (that run consumes the generator differently).

Logprobs (raw or processed) come from the same position's logits, so they equal plain decode's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from trtpipe.runtime.sample.logprobs import TokenLogprobs
from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sample.sampler import SampleRow, draw, filtered_distribution, logprob_records, processed_logits


@dataclass(frozen=True)
class Verified:
    """One verify row's outcome: ``token_ids`` (1..k+1: the accepted drafts, then the correction or
    bonus token), ``num_accepted`` drafts, and a logprob record per emitted token (or None each)."""

    token_ids: tuple[int, ...]
    num_accepted: int
    logprobs: tuple[TokenLogprobs | None, ...]


def verify(
    logits: np.ndarray,
    draft_token_ids: Sequence[int],
    row: SampleRow,
    *,
    eos_token_ids: Iterable[int] = (),
    logprobs_mode: str = "raw",
) -> Verified:
    """Accept a prefix of ``draft_token_ids`` (k tokens) given ``logits [k + 1, V]`` float32 of the
    verify chunk (row j: after j drafts). ``row``: the request's parameters, generator and
    history before the chunk (no grammar: speculation is off for structured outputs)."""
    k = len(draft_token_ids)
    assert logits.shape[0] == k + 1, (logits.shape, k)
    drafts = [int(d) for d in draft_token_ids]
    out = list(row.output_token_ids)
    rows = [SampleRow(row.params, row.rng, row.prompt_token_ids, out + drafts[:j]) for j in range(k + 1)]
    raw = np.asarray(logits, np.float32)
    x = processed_logits(raw, rows, eos_token_ids=eos_token_ids)
    if row.params.is_greedy:
        target = np.argmax(x, axis=-1)
        a = 0
        while a < k and int(target[a]) == drafts[a]:
            a += 1
        tokens = drafts[:a] + [int(target[a])]
    else:
        tokens = accept_sampled(x, drafts, row.params, row.rng or np.random.default_rng())
        a = len(tokens) - 1
    chosen = np.asarray(tokens, np.int64)
    n = len(tokens)
    lps = logprob_records(raw[:n], x[:n], chosen, [row.params] * n, logprobs_mode)
    return Verified(tuple(tokens), a, tuple(lps))


def accept_sampled(x: np.ndarray, drafts: Sequence[int], params: SamplingParams, rng: np.random.Generator) -> list[int]:
    """The rejection rule (module doc) over processed logits ``x [k + 1, V]``: the accepted drafts,
    then one token drawn from the residual (on a rejection) or from position k (all accepted)."""
    out: list[int] = []
    for j, d in enumerate(drafts):
        ids, probs = filtered_distribution(x[j], params)
        hit = np.flatnonzero(ids == d)
        p_d = float(probs[hit[0]]) if len(hit) else 0.0
        if rng.random() < p_d:
            out.append(int(d))
            continue
        if len(hit):  # the residual max(0, p - q) for a point mass q on d: p without d
            probs = probs.copy()
            probs[hit[0]] = 0.0
        out.append(draw(ids, probs, rng))
        return out
    ids, probs = filtered_distribution(x[len(drafts)], params)
    out.append(draw(ids, probs, rng))
    return out


__all__ = ["Verified", "accept_sampled", "verify"]
