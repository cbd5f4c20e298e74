"""Teacher-forced agreement of re-quantized weights with the golden outputs, measured on the CPU.

The plugin-free TensorRT variant of an INT4 recipe with asymmetric weights (GGUF Q4_1) carries
symmetric INT4 blocks re-quantized from the dequantized weights
(:func:`~trtpipe.plugins.ops.int4_gemm.pack.requantize_symmetric`), because TensorRT's INT4
``DequantizeLinear`` has no zero point. Those weights are not the artifact's other weights, so
the build measures them before it ships them: the torch reference with exactly the weights the
lowering writes (the same function on the same packed codes, scales and zero points), run
teacher-forced over the golden sequences::

    prompt + golden[:-1] ──forward_dense (one pass, fp32 activations)──► logits [L, V]
    argmax at positions len(prompt)-1 .. L-1  vs  golden output ids      -> agree / total

This is the measure ``trtpipe validate`` gates on (runtime/measure/teacher_forcing.py feeds the same
tokens step by step through the engines); here it runs in fp32 activations on the CPU, not in
TensorRT's fp16 (docs/tensorrt.md says what ran).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Agreement:
    agree: int
    total: int

    @property
    def value(self) -> float:
        return self.agree / self.total if self.total else 0.0


def has_asymmetric_int4(ref: Any) -> bool:
    """True if any 4-bit linear of the reference has a zero point other than 8."""
    from trtpipe.pipeline.model import Int4Linear

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
    from trtpipe.pipeline.model import FloatLinear, Int4Linear
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

    from trtpipe.pipeline.golden import torch_threads

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


__all__ = ["Agreement", "has_asymmetric_int4", "requantized_reference", "teacher_forced_agreement_dense"]
