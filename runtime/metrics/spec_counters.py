"""``SpeculationCounters``: the running totals of speculative decoding since load (vLLM's
``spec_decode_*`` counters), behind the ``trtpipe:spec_decode_*`` metrics and the reports' line.
Kept by a speculator (:class:`~trtpipe.runtime.speculative.speculator.NgramSpeculator`), read by
the server (:mod:`trtpipe.runtime.serve.spec_metrics`) and validate."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class SpeculationCounters:
    """Totals since load (vLLM's ``spec_decode_*`` counters): verifies (``num_drafts``), proposed
    tokens, accepted tokens, ``accepted_per_position[i]``: verifies that accepted proposed token
    i + 1, and the histogram of acceptance lengths."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    # verifies by acceptance length (1 + accepted tokens: the tokens one verify emitted), index = length
    acceptance_length_counts: list[int] = field(default_factory=list)

    def copy(self) -> SpeculationCounters:
        return replace(
            self,
            accepted_per_position=list(self.accepted_per_position),
            acceptance_length_counts=list(self.acceptance_length_counts),
        )

    def since(self, before: SpeculationCounters) -> dict:
        """The totals added since ``before`` (a :meth:`copy`), with vLLM's derived figures:
        acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts."""
        drafts = self.num_drafts - before.num_drafts
        tokens = self.num_draft_tokens - before.num_draft_tokens
        accepted = self.num_accepted_tokens - before.num_accepted_tokens
        return {
            "num_drafts": drafts,
            "num_draft_tokens": tokens,
            "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / tokens if tokens else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_length_counts": [
                a - b for a, b in zip(self.acceptance_length_counts, before.acceptance_length_counts)
            ],
        }

    @staticmethod
    def line(d: dict) -> str:
        """One line of a :meth:`since` dict for reports."""
        if not d["num_drafts"]:
            return "speculative decoding: no verify ran"
        return (
            f"speculative decoding: {d['num_drafts']} verifies, {d['num_accepted_tokens']}/{d['num_draft_tokens']} "
            f"proposed tokens accepted ({d['acceptance_rate']:.0%}), mean acceptance length "
            f"{d['mean_acceptance_length']:.2f} tokens per verify"
        )


__all__ = ["SpeculationCounters"]
