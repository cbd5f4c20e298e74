"""How many proposed tokens each decoding row verifies this step: the k that maximizes the
expected output tokens per second of the step, from the measured verify cost and each request's
running acceptance rate; k = 0 (plain decode) when speculation does not pay.

Acceptance model (Leviathan et al. 2023, section 3.1): each proposed token is accepted with
probability alpha, independently, until the first rejection, so the j-th token of a proposal is
kept with probability alpha^j and a row verifying k tokens yields in expectation::

    E(k) = 1 + alpha + alpha^2 + ... + alpha^k        (the 1: the correction / bonus token)

A step whose rows verify k_r tokens each computes ``T = base + sum k_r`` tokens and takes
``cost(T)`` seconds (:class:`~trtpipe.runtime.speculative.cost.VerifyCost`, measured at load). The
marginal gains alpha_r^j are sorted (each row's fall with j, so a row's j-th token always comes
after its (j-1)-th); the step takes the prefix of that order with the highest
``sum E / cost(T)``: every prefix is evaluated, because measured costs are not convex (on the Zen
4 host a 2-token call costs 1.06x a decode, a 3-token one 1.20x). ``min_gain`` (relative) asks
speculation to beat plain decoding by that much before it runs, against the noise in ``cost``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

ALPHA_MAX = 0.98  # an estimate of 1 would make every proposal look free


def draft_lengths(
    offers: Sequence[tuple[float, int]], step_s: Callable[[int], float], base_tokens: int, min_gain: float = 0.0
) -> list[int]:
    """k per row for ``offers``: ``(alpha, most tokens this row can propose)``; ``step_s(T)``: the
    predicted seconds of a step computing T tokens; ``base_tokens``: what the step computes
    without speculation (one per decoding row). Returns a list parallel to ``offers``."""
    gains = sorted(
        ((min(max(a, 0.0), ALPHA_MAX) ** j, r) for r, (a, m) in enumerate(offers) for j in range(1, m + 1)),
        key=lambda g: -g[0],
    )
    expected = float(len(offers))
    best_rate, best_n = expected / step_s(base_tokens) * (1.0 + min_gain), 0
    for n, (gain, _r) in enumerate(gains, 1):
        expected += gain
        rate = expected / step_s(base_tokens + n)
        if rate > best_rate:
            best_rate, best_n = rate, n
    k = [0] * len(offers)
    for _gain, r in gains[:best_n]:
        k[r] += 1
    return k


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) of the module docstring."""
    return sum(alpha**j for j in range(k + 1))


__all__ = ["ALPHA_MAX", "draft_lengths", "expected_tokens"]
