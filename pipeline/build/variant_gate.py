"""The plugin-free variant's accuracy gate (JetPack 6 Orin: TensorRT < 10.7, no plugins).

TensorRT's INT4 ``DequantizeLinear`` is symmetric only, so asymmetric INT4 weights (GGUF Q4_1)
reach the plugin-free graphs changed (``engine.plugin_free_int4``): re-quantized symmetrically or
dequantized to the activation dtype. The build measures what that costs, teacher-forced against
the golden outputs with the torch reference on the CPU (:mod:`trtpipe.pipeline.variant_agreement`),
and keeps the variant only at ``validate.correctness.plugin_free_teacher_forced_agreement_min`` or above.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trtpipe.pipeline.recipe import Recipe
from trtpipe.plugins.core.versions import TRT_PLUGINS_REQUIREMENT

PLUGIN_FREE_INT4_WEIGHTS = {
    "requantize_symmetric": "int4 symmetric, re-quantized (least-squares scale per block) from the dequantized weights",
    "dequantize_float": "the dequantized INT4 weights stored in the activation dtype (float MatMul)",
}


def plugin_free_agreement_min(recipe: Recipe) -> float | None:
    """``validate.correctness.plugin_free_teacher_forced_agreement_min`` (None: not gated)."""
    c = recipe.validation.correctness
    return c.plugin_free_teacher_forced_agreement_min if c is not None else None


def gate_requantized_variant(
    recipe: Recipe, ref_int4: Any, golden: dict, *, log: Callable[[str], None] = print
) -> tuple[dict, str | None]:
    """Measure the plugin-free variant's changed weights against the golden outputs and gate them.
    Returns (record for the spec, refusal reason or None)."""
    from trtpipe.pipeline.variant_agreement import requantized_reference, teacher_forced_agreement_dense

    c = recipe.validation.correctness
    mode = recipe.engine.plugin_free_int4
    minimum = plugin_free_agreement_min(recipe)
    t = time.perf_counter()
    log(
        f"measuring the plugin-free variant's weights ({mode}): teacher-forced on {len(golden['sequences'][: c.num_sequences])} golden "
        f"sequences x {c.num_tokens} tokens (torch reference, fp32 activations, CPU) ..."
    )
    ref = requantized_reference(ref_int4, mode, weight_dtype=recipe.activation_dtype("prefill"))
    a = teacher_forced_agreement_dense(ref, golden, c.num_sequences, c.num_tokens)
    record = {
        "agreement": round(a.value, 6),
        "agreeing_tokens": f"{a.agree}/{a.total}",
        "minimum": minimum,
        "weights": PLUGIN_FREE_INT4_WEIGHTS[mode],
        "method": "teacher-forced argmax vs the fp32 golden outputs; torch reference with the same weights, "
        "fp32 activations, on the build machine's CPU (not TensorRT)",
        "seconds": round(time.perf_counter() - t, 1),
    }
    log(f"  plugin-free weights ({mode}): agreement {a.value:.4f} ({a.agree}/{a.total}) vs min {minimum}")
    if minimum is not None and a.value < minimum:
        other = "dequantize_float" if mode == "requantize_symmetric" else "a higher-precision phase"
        return record, (
            f"its weights ({PLUGIN_FREE_INT4_WEIGHTS[mode]}; engine.plugin_free_int4: {mode}) agree with "
            f"the fp32 reference on {a.agree}/{a.total} = {a.value:.4f} teacher-forced tokens, below "
            f"validate.correctness.plugin_free_teacher_forced_agreement_min = {minimum}. Fix: use {other}, "
            f"upgrade to {TRT_PLUGINS_REQUIREMENT} (JetPack 7) for the plugins, or lower the minimum if "
            "this agreement is acceptable."
        )
    return record, None
