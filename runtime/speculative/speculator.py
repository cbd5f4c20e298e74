"""``NgramSpeculator``: per-request n-gram proposals, sized per step, with the running acceptance
statistics and the counters behind the ``trtpipe:spec_decode_*`` metrics.

The scheduler asks it, in a step that only decodes (no prompt chunk running or waiting for a
free batch row, so prefill sizing and TTFT are untouched), for the proposal of every decoding
request (:meth:`propose`); the step runner reports each verify's outcome (:meth:`on_verified`).

Acceptance rate per request (alpha for :mod:`~trtpipe.runtime.speculative.sizing`): a verify that
accepted a of k proposed tokens counts a successes and, when a < k, one failure (the tokens after
the first rejection were never tested). The estimate is ``(successes + PRIOR_WEIGHT * prior) /
(trials + PRIOR_WEIGHT)``, prior = the acceptance rate of all requests so far (0.5 before any);
the counts decay by ``DECAY`` per verify, so the estimate follows the request's recent text, and
by ``DECAY`` per step in which a proposal existed but did not pay, so a request switched off
drifts back to the prior.

Exploration: after ``EXPLORE_AFTER_STEPS`` steps in a row in which a request had a proposal that did not
pay, its first proposed token is verified anyway (k = 1, the cheapest verify), so its estimate and
the prior learn from the text instead of staying where they are. Without it a start whose verify
cost was measured on a busy moment (a 2-token verify at >= 1.47x a decode step: k = 1 does not pay
at the prior 0.5) never verifies, and so never finds out that the text repeats.
It costs at most one 2-token row per ``EXPLORE_AFTER_STEPS`` steps of such a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtpipe.runtime.metrics.spec_counters import SpeculationCounters
from trtpipe.runtime.speculative.config import SpeculativeConfig
from trtpipe.runtime.speculative.cost import VerifyCost
from trtpipe.runtime.speculative.ngram import NgramIndex
from trtpipe.runtime.speculative.sizing import draft_lengths

PRIOR_WEIGHT = 2.0
DECAY = 0.9
MIN_GAIN = 0.02  # speculation must beat plain decoding by 2 % in expectation (cost noise)
EXPLORE_AFTER_STEPS = 16  # unpaid proposal steps in a row before a 1-token verify (module doc)


@dataclass
class _State:
    index: NgramIndex
    successes: float = 0.0
    trials: float = 0.0
    unpaid_steps: int = 0  # proposal steps in a row that did not pay


class NgramSpeculator:
    """Proposals (:class:`NgramIndex`) for the scheduler, sized by :func:`draft_lengths` with
    ``cost`` (None: not measured, every proposal of up to ``config.max_k`` tokens is verified)."""

    def __init__(self, config: SpeculativeConfig, cost: VerifyCost | None):
        self.config = config
        self.cost = cost
        self._states: dict[str, _State] = {}
        self.reset_counters()

    def reset_counters(self) -> None:
        """Forget what ran so far (the served totals and the acceptance prior start at 0): for the
        server's warm-up request, which is not traffic."""
        k = self.config.max_k
        self.counters = SpeculationCounters(accepted_per_position=[0] * k, acceptance_length_counts=[0] * (k + 2))
        self._all_successes = 0.0
        self._all_trials = 0.0

    def alpha(self, request_id: str) -> float:
        """The request's acceptance-rate estimate (module doc)."""
        prior = (self._all_successes + 1.0) / (self._all_trials + 2.0)
        s = self._states.get(request_id)
        successes, trials = (s.successes, s.trials) if s is not None else (0.0, 0.0)
        return (successes + PRIOR_WEIGHT * prior) / (trials + PRIOR_WEIGHT)

    def propose(self, requests: Sequence, limits: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """Proposals for decoding ``requests`` (each at most ``limits[i]`` tokens: its length limits
        and the step's token budget), sized to pay; only non-empty ones are returned."""
        live = {r.request_id for r in requests}
        for rid in [rid for rid in self._states if rid not in live]:
            del self._states[rid]  # finished or preempted (a preempted one rebuilds its index)
        offers, props = [], []
        for r, limit in zip(requests, limits):
            prop: tuple[int, ...] = ()
            if limit > 0:
                prop, _n = self._state(r).index.propose(min(limit, self.config.max_k))
            props.append(prop)
            offers.append((self.alpha(r.request_id), len(prop)))
        if not any(props):
            return {}
        if self.cost is None:
            ks = [len(p) for p in props]
        else:
            base = len(requests)
            cost = self.cost

            def step_s(t: int) -> float:
                return cost.step_s(base, 0) if t <= base else cost.step_s(base - 1, t - base + 1)

            ks = draft_lengths(offers, step_s, base, MIN_GAIN)
        out = {}
        for r, prop, k in zip(requests, props, ks):
            if not prop:
                continue
            s = self._states[r.request_id]  # made by _state() with the proposal
            if k:
                out[r.request_id] = prop[:k]
                s.unpaid_steps = 0
            else:
                s.unpaid_steps += 1
                if s.unpaid_steps >= EXPLORE_AFTER_STEPS:  # explore: verify one token (module doc)
                    out[r.request_id] = prop[:1]
                    s.unpaid_steps = 0
                else:  # a proposal that did not pay: drift to the prior
                    s.successes *= DECAY
                    s.trials *= DECAY
        return out

    def on_verified(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        """Record a verify of ``num_proposed`` tokens of which the first ``num_accepted`` were kept."""
        c = self.counters
        c.num_drafts += 1
        c.num_draft_tokens += num_proposed
        c.num_accepted_tokens += num_accepted
        c.acceptance_length_counts[1 + num_accepted] += 1
        for i in range(num_accepted):
            c.accepted_per_position[i] += 1
        failures = 1.0 if num_accepted < num_proposed else 0.0
        self._all_successes += num_accepted
        self._all_trials += num_accepted + failures
        s = self._states.get(request_id)
        if s is not None:
            s.successes = DECAY * s.successes + num_accepted
            s.trials = DECAY * s.trials + num_accepted + failures

    def _state(self, request) -> _State:
        s = self._states.get(request.request_id)
        if s is None:
            s = self._states[request.request_id] = _State(NgramIndex(self.config.min_n, self.config.max_n))
        s.index.sync(request.prompt_token_ids, request.output_token_ids)
        return s


__all__ = ["DECAY", "EXPLORE_AFTER_STEPS", "MIN_GAIN", "NgramSpeculator", "PRIOR_WEIGHT"]
