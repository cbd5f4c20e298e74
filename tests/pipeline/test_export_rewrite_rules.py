"""The export's optimize step skips onnxscript rewrite rules that never match our graphs (they
cost most of its time); the skip is scoped and names rules this onnxscript has. That the
optimized graphs are unchanged is checked by the fusion counts and logits of test_passes.py and
test_export_parity.py (a rule our passes needed would drop the rotary fusion, as measured)."""

from __future__ import annotations

from trtpipe.pipeline.stages.export import _SKIPPED_REWRITE_RULES, _without_unused_rewrite_rules


def test_skipped_rules_exist_and_are_restored_after_the_block():
    from onnxscript import rewriter

    before = rewriter._DEFAULT_REWRITE_RULES
    names = {r.name for r in before}
    missing = _SKIPPED_REWRITE_RULES - names
    assert not missing, (
        f"onnxscript no longer has rule(s) {missing}: update _SKIPPED_REWRITE_RULES in pipeline/stages/export.py"
    )
    with _without_unused_rewrite_rules():
        inside = {r.name for r in rewriter._DEFAULT_REWRITE_RULES}
        assert inside == names - _SKIPPED_REWRITE_RULES
    assert rewriter._DEFAULT_REWRITE_RULES is before
    try:
        with _without_unused_rewrite_rules():
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert rewriter._DEFAULT_REWRITE_RULES is before
