"""Validate's correctness check: the artifact's outputs against the golden outputs recorded at build.

fp32 prefill and decode: greedy ids must equal the golden ids exactly (both stop at EOS). Otherwise
(INT4, fp16...): teacher-forced argmax agreement over all positions of the golden sequences must be
>= ``validate.correctness.int4_teacher_forced_agreement_min`` (an artifact whose INT4 weights were
changed for the plugin-free TensorRT lowering: ``plugin_free_teacher_forced_agreement_min``).

The verdict is a frozen :class:`CorrectnessResult`; :meth:`CorrectnessResult.to_dict` is the
``correctness`` object of report.json (keys as before the record existed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.pipeline.recipe import CorrectnessSpec, Recipe
from trtpipe.runtime.errors import ArtifactError

_CHANGED_INT4_WEIGHTS = ("requantize_symmetric", "dequantize_float")  # engine.plugin_free_int4 forms


@dataclass(frozen=True)
class ExactSequence:
    """One golden sequence checked for exact greedy ids (fp32 artifacts)."""

    prompt: str
    tokens: int  # golden tokens compared
    exact: bool
    first_mismatch: int | None  # position of the first differing id; None when equal


@dataclass(frozen=True)
class Flip:
    """One teacher-forced position where the engine's argmax differs from the reference's token."""

    position: int  # 0 = the first generated token
    reference_margin: float | None  # the reference's top-1 minus top-2 logit there (None: not recorded)
    got: int  # the engine's argmax
    want: int  # the reference's token


@dataclass(frozen=True)
class AgreementSequence:
    """One golden sequence checked by teacher-forced argmax agreement."""

    prompt: str
    tokens: int
    agreement: float  # fraction of positions whose argmax equals the golden id, rounded to 4 places
    first_token_ok: bool  # the first generated token equals the reference's
    flips: tuple[Flip, ...]  # every disagreement, with the reference's margin there
    max_reference_top1_gap_at_mismatch: float | None  # the largest of those margins


@dataclass(frozen=True)
class Agreement:
    """Teacher-forced agreement over all checked positions and the gates it was held to."""

    agreement: float  # agreeing / total
    agreeing_tokens: int
    threshold: float
    threshold_key: str  # the recipe key of the threshold (validate.correctness.<key>)
    in_reference_top5: int  # positions whose prediction is in the reference's top 5
    num_sequences: int
    first_tokens_ok: int  # sequences whose first generated token equals the reference's
    tie_threshold_logits: float
    non_tie_flips: int  # disagreements where the reference margin >= tie_threshold_logits (or unknown)
    strict: bool  # the first-token and non-tie checks apply (False: the plugin-free variant's gate)

    @property
    def passed(self) -> bool:
        """The gates of the module docstring."""
        if self.agreement < self.threshold:
            return False
        return not self.strict or (self.non_tie_flips == 0 and self.first_tokens_ok == self.num_sequences)


@dataclass(frozen=True)
class CorrectnessResult:
    """The correctness verdict of one validate run (``agreement`` None: the exact-ids method)."""

    reference: str
    precision: str  # precision_label: "prefill int4, decode int4, KV fp16"
    settings_from: str  # "recipe", or the defaults when the recipe has no validate.correctness
    method: str
    passed: bool
    num_tokens: int  # golden tokens compared over all sequences
    sequences: tuple[ExactSequence, ...] | tuple[AgreementSequence, ...]
    agreement: Agreement | None = None
    notes: str | None = None  # golden.json holds fewer sequences/tokens than asked
    seconds: float | None = None  # wall time of the check

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready ``correctness`` object of report.json."""
        out: dict[str, Any] = {
            "reference": self.reference,
            "precision": self.precision,
            "settings_from": self.settings_from,
            "num_sequences": len(self.sequences),
            "method": self.method,
        }
        a = self.agreement
        if a is None:
            num_ok = sum(s.exact for s in self.sequences)  # type: ignore[union-attr]
            out.update(passed=self.passed, sequences_exact=f"{num_ok}/{len(self.sequences)}")
        else:
            out.update(
                agreement=round(a.agreement, 6),
                agreeing_tokens=f"{a.agreeing_tokens}/{self.num_tokens}",
                threshold=a.threshold,
                threshold_key=a.threshold_key,
                passed=self.passed,
                margin=round(a.agreement - a.threshold, 6),
                in_reference_top5=f"{a.in_reference_top5}/{self.num_tokens}",
                first_tokens=f"{a.first_tokens_ok}/{a.num_sequences}",
                tie_threshold_logits=a.tie_threshold_logits,
                non_tie_flips=a.non_tie_flips,
                strict=a.strict,
            )
        out.update(num_tokens=self.num_tokens, sequences=[dataclasses.asdict(s) for s in self.sequences])
        if self.notes:
            out["notes"] = self.notes
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    def line(self) -> str:
        """One rich-markup line for the console."""
        verdict = "[green]PASS[/green]" if self.passed else "[red]FAIL[/red]"
        a = self.agreement
        if a is not None:
            strict = (
                f"; first tokens {a.first_tokens_ok}/{a.num_sequences}, flips at reference margin >= "
                f"{a.tie_threshold_logits:g}: {a.non_tie_flips}"
                if a.strict
                else ""
            )
            return (
                f"correctness ({self.precision}): teacher-forced agreement {a.agreement:.4f} "
                f"({a.agreeing_tokens}/{self.num_tokens} tokens) vs min {a.threshold:g}, margin "
                f"{a.agreement - a.threshold:+.4f}{strict}: {verdict}"
            )
        num_ok = sum(s.exact for s in self.sequences)  # type: ignore[union-attr]
        return (
            f"correctness ({self.precision}): exact greedy ids on {num_ok}/{len(self.sequences)} golden "
            f"sequences: {verdict}"
        )

    def failures(self) -> list[str]:
        """One line per failed check (empty when it passed): what differed and where."""
        a = self.agreement
        if a is None or self.passed:
            return []
        out = []
        if a.agreement < a.threshold:
            out.append(f"agreement {a.agreement:.4f} < {a.threshold:g} ({a.threshold_key})")
        if a.strict:
            for s in self.sequences:
                assert isinstance(s, AgreementSequence)
                if not s.first_token_ok:
                    f0 = s.flips[0]
                    out.append(
                        f"{s.prompt!r}: first token {f0.got} != reference {f0.want} (margin {f0.reference_margin})"
                    )
                for f in s.flips:
                    if f.position and (f.reference_margin is None or f.reference_margin >= a.tie_threshold_logits):
                        out.append(
                            f"{s.prompt!r}: token {f.position} {f.got} != reference {f.want} at reference margin "
                            f"{f.reference_margin} >= tie threshold {a.tie_threshold_logits:g}"
                        )
        return out


def load_golden(manifest: Any) -> dict:
    """golden.json of the artifact (recorded at build time); :class:`ArtifactError` if absent."""
    rebuild = manifest.rebuild_command
    if not manifest.golden_file:
        raise ArtifactError(
            f"artifact {manifest.root} records no golden outputs (golden_file is "
            f"empty), so correctness cannot be checked. Fix: `{rebuild}`."
        )
    path = manifest.path(manifest.golden_file)
    try:
        golden = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ArtifactError(f"golden outputs {path}: unreadable ({e}). Fix: `{rebuild}`.") from None
    seqs = golden.get("sequences") if isinstance(golden, dict) else None
    ok = (
        isinstance(seqs, list)
        and bool(seqs)
        and all(isinstance(s, dict) and s.get("prompt_ids") and s.get("output_ids") for s in seqs)
    )
    if not ok:
        raise ArtifactError(
            f'golden outputs {path}: expected a non-empty "sequences" list whose '
            f"items have prompt_ids and output_ids. Fix: `{rebuild}`."
        )
    return golden


def _exact_sequences(llm: Any, seqs: Sequence[dict], num_tokens: int) -> tuple[ExactSequence, ...]:
    from trtpipe.runtime.measure.teacher_forcing import first_mismatch, greedy_ids

    rows = []
    for s in seqs:
        want = [int(t) for t in s["output_ids"][:num_tokens]]
        got = greedy_ids(llm, s["prompt_ids"], len(want))
        rows.append(ExactSequence(s.get("prompt", ""), len(want), got == want, first_mismatch(got, want)))
    return tuple(rows)


def reference_margins(seq: dict) -> list[float | None]:
    """The reference's top-1 minus top-2 logit at each generated position of a golden sequence:
    ``top2_margin`` when recorded, else from ``top5`` (None where neither has two entries)."""
    if "top2_margin" in seq:
        return [float(m) for m in seq["top2_margin"]]
    return [t[0][1] - t[1][1] if len(t) > 1 else None for t in seq.get("top5") or []]


def _agreement_sequences(llm: Any, seqs: Sequence[dict], num_tokens: int) -> tuple[tuple[AgreementSequence, ...], int]:
    """Per-sequence rows and the positions in the reference's top 5."""
    from trtpipe.runtime.measure import teacher_forcing

    rows, in_top5 = [], 0
    for s in seqs:
        want = [int(t) for t in s["output_ids"][:num_tokens]]
        frac, preds = teacher_forcing.teacher_forced_agreement(llm, s["prompt_ids"], want)
        top5 = s.get("top5") or []
        in_top5 += sum(1 for i, p in enumerate(preds) if i < len(top5) and p in [int(t) for t, _ in top5[i]])
        margins = reference_margins(s)
        # How close the reference itself was to its runner-up where we disagree: near-ties
        # (small margins) are rounding noise, large margins point at a real error.
        flips = tuple(
            Flip(i, None if i >= len(margins) or margins[i] is None else round(margins[i], 4), p, w)
            for i, (p, w) in enumerate(zip(preds, want))
            if p != w
        )
        known = [f.reference_margin for f in flips if f.reference_margin is not None]
        rows.append(
            AgreementSequence(
                s.get("prompt", ""),
                len(want),
                round(frac, 4),
                preds[0] == want[0],
                flips,
                max(known) if known else None,
            )
        )
    return tuple(rows), in_top5


def agreement_threshold(llm: Any, spec: CorrectnessSpec) -> tuple[float, str]:
    """(minimum agreement, its recipe key): the plugin-free gate for an artifact whose INT4 weights
    were changed for TensorRT (manifest ``backend.int4_weights``), else the INT4 one."""
    backend = getattr(getattr(llm, "manifest", None), "backend", None) or {}
    plugin_free_min = spec.plugin_free_teacher_forced_agreement_min
    if backend.get("int4_weights") in _CHANGED_INT4_WEIGHTS and plugin_free_min is not None:
        return plugin_free_min, "plugin_free_teacher_forced_agreement_min"
    return spec.int4_teacher_forced_agreement_min, "int4_teacher_forced_agreement_min"


def _notes(spec: CorrectnessSpec, golden: dict, num_seqs: int) -> str | None:
    notes = []
    if spec.num_sequences is not None and num_seqs < spec.num_sequences:
        notes.append(f"num_sequences {spec.num_sequences} asked, golden.json holds {num_seqs}")
    if golden.get("num_tokens") is not None and golden["num_tokens"] < spec.num_tokens:
        notes.append(
            f"num_tokens {spec.num_tokens} asked, golden.json was recorded with "
            f"{golden['num_tokens']}; rebuild to record more"
        )
    return "; ".join(notes) or None


def precision_label(recipe: Recipe) -> str:
    """What a run computes in, for reports: ``"prefill int4, decode int4, KV fp16"`` (the KV pool
    dtype moves agreement too)."""
    return f"prefill {recipe.precision.prefill}, decode {recipe.precision.decode}, KV {recipe.kv_dtype}"


def check_correctness(llm: Any, recipe: Recipe, golden: dict) -> CorrectnessResult:
    """Compare the artifact's outputs with the golden ones (see the module docstring for the two
    methods). Uses the first ``num_sequences`` golden sequences, each cut to ``num_tokens`` tokens."""
    spec = recipe.validation.correctness
    source = "recipe" if spec is not None else "defaults (the recipe has no validate.correctness)"
    spec = spec or CorrectnessSpec()
    seqs = golden["sequences"][: spec.num_sequences]
    prec = recipe.precision
    common = dict(
        reference=golden.get("reference", "golden.json"),
        precision=precision_label(recipe),
        settings_from=source,
        notes=_notes(spec, golden, len(seqs)),
    )
    if prec.prefill == "fp32" and prec.decode == "fp32":
        rows = _exact_sequences(llm, seqs, spec.num_tokens)
        return CorrectnessResult(
            method="exact greedy token ids (fp32 prefill and decode)",
            passed=all(r.exact for r in rows),
            num_tokens=sum(r.tokens for r in rows),
            sequences=rows,
            **common,
        )
    arows, in_top5 = _agreement_sequences(llm, seqs, spec.num_tokens)
    total = sum(r.tokens for r in arows)
    agree = total - sum(len(r.flips) for r in arows)
    threshold, key = agreement_threshold(llm, spec)
    tie = spec.tie_threshold_logits
    agreement = Agreement(
        agree / total,
        agree,
        threshold,
        key,
        in_top5,
        num_sequences=len(arows),
        first_tokens_ok=sum(r.first_token_ok for r in arows),
        tie_threshold_logits=tie,
        non_tie_flips=sum(1 for r in arows for f in r.flips if f.reference_margin is None or f.reference_margin >= tie),
        strict=key == "int4_teacher_forced_agreement_min",
    )
    return CorrectnessResult(
        method="teacher-forced argmax agreement, first tokens and non-tie flips",
        passed=agreement.passed,
        num_tokens=total,
        sequences=arows,
        agreement=agreement,
        **common,
    )
