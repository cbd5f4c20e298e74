"""The plugin-free variant's accuracy gate (JetPack 6 Orin: TensorRT < 10.7, no plugins).

TensorRT's INT4 ``DequantizeLinear`` is symmetric only, so asymmetric INT4 weights (GGUF Q4_1)
reach the plugin-free graphs changed (``engine.plugin_free_int4``): re-quantized symmetrically
(:func:`~trtpipe.plugins.ops.int4_gemm.pack.requantize_symmetric`) or dequantized to the activation dtype.
Those weights are not the artifact's other weights, so the build measures them before it ships
them: the torch reference with exactly the weights the lowering writes (the same function on the
same packed codes, scales and zero points), run teacher-forced over the golden sequences::

    prompt + golden[:-1] ──forward_dense (one pass, fp32 activations)──► logits [L, V]
    argmax at positions len(prompt)-1 .. L-1  vs  golden output ids      -> agree / total

and keeps the variant only at ``validate.correctness.plugin_free_teacher_forced_agreement_min``
or above. This is the measure ``trtpipe validate`` gates on (runtime/measure/teacher_forcing.py
feeds the same tokens step by step through the engines); here it runs in fp32 activations on the
CPU, not in TensorRT's fp16 (docs/tensorrt.md says what ran).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtpipe.pipeline.recipe import Recipe
from trtpipe.plugins.core.versions import TRT_PLUGINS_REQUIREMENT


@dataclass(frozen=True)
class Agreement:
    agree: int
    total: int

    @property
    def value(self) -> float:
        return self.agree / self.total if self.total else 0.0


def has_asymmetric_int4(ref: Any) -> bool:
    """True if any 4-bit linear of the reference has a zero point other than 8."""
    from trtpipe.pipeline.model.reference import Int4Linear

    return any(isinstance(m, Int4Linear) and m.bits == 4 and bool((m.zero_points != 8).any()) for m in ref.modules())


def _float_dtype(name: str):
    if name == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"fp16": np.float16, "fp32": np.float32}[name]


def requantized_reference(ref_int4: Any, mode: str = "requantize_symmetric", *, weight_dtype: str = "fp16") -> Any:
    """A copy of an INT4 reference whose asymmetric 4-bit linears compute with the weights the
    plugin-free lowering writes for ``mode`` (``engine.plugin_free_int4``), held as float32:

    - ``requantize_symmetric``: ``(code - 8) * scale`` of the symmetric blocks (the values
      ``int4_gemm`` would dequantize, bit for bit, without dequantizing them at every call);
    - ``dequantize_float``: the dequantized weights rounded to ``weight_dtype`` (the cast pass
      stores them in the activation dtype).

    8-bit and symmetric linears are unchanged."""
    from trtpipe.pipeline.model.reference import FloatLinear, Int4Linear
    from trtpipe.plugins.ops.int4_gemm.pack import requantize_symmetric
    from trtpipe.plugins.ops.int4_gemm.reference import dequantize_int4

    out = copy.deepcopy(ref_int4)
    for parent in list(out.modules()):
        for name, m in list(parent.named_children()):
            if not isinstance(m, Int4Linear) or m.bits != 4 or not bool((m.zero_points != 8).any()):
                continue
            args = (m.b_packed.numpy(), m.scales.numpy(), m.zero_points.numpy(), m.K, m.N, m.group_size)
            if mode == "requantize_symmetric":
                packed, scales = requantize_symmetric(*args)
                w = dequantize_int4(packed, scales, None, m.K, m.N, m.group_size)  # [N, K] float32
            elif mode == "dequantize_float":
                w = dequantize_int4(*args).astype(_float_dtype(weight_dtype)).astype(np.float32)
            else:
                raise ValueError(f"mode {mode!r}: expected requantize_symmetric or dequantize_float")
            bias = None if m.bias is None else m.bias.detach().numpy()
            setattr(parent, name, FloatLinear(w, bias))
    return out


def teacher_forced_agreement_dense(ref: Any, golden: dict, num_sequences: int, num_tokens: int) -> Agreement:
    """Argmax agreement of ``ref`` (a LlamaReference) with the golden output ids, teacher-forced,
    over the first ``num_sequences`` sequences cut to ``num_tokens`` tokens (as validate does)."""
    import torch

    from trtpipe.pipeline.stages.golden import torch_threads

    agree = total = 0
    for s in golden["sequences"][:num_sequences]:
        prompt = [int(t) for t in s["prompt_ids"]]
        want = [int(t) for t in s["output_ids"][:num_tokens]]
        ids = torch.tensor([prompt + want[:-1]], dtype=torch.int64)
        with torch_threads(1):
            logits = ref.forward_dense(ids)[0]  # [L, V]
        preds = logits[len(prompt) - 1 :].argmax(-1).tolist()
        agree += sum(p == w for p, w in zip(preds, want))
        total += len(want)
    return Agreement(agree, total)


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
