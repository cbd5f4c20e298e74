#!/usr/bin/env python3
"""Teacher-forced agreement of the INT4 weight forms trtpipe builds, against the fp32 golden outputs.

    python bench/plugin_free_agreement.py [--golden artifacts/smollm2-135m-cpu/cpu/golden.json]
                                          [--recipe smollm2-135m-orin] [--num-tokens N]

Runs the torch reference (fp32 activations, CPU) of the recipe's model, teacher-forced over the
golden sequences (pipeline/stages/tensorrt/variant_gate.py), with each weight form:

- fp32: the dequantized weights the golden outputs come from (a check of the method: ~1.0);
- int4 Q4_1 exact (the plugin variant and the CPU default): the golden's own weights, not rerun;
- the plugin-free variant's weight forms (engine.plugin_free_int4): the dequantized weights in
  fp16 (dequantize_float), symmetric INT4 with least-squares scales (requantize_symmetric), and
  plain round-to-nearest symmetric INT4 (absmax/7) for comparison;
- optionally (--cpu-artifact) a CPU artifact through the runtime's teacher forcing (ONNX Runtime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", type=Path, default=ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu" / "golden.json")
    ap.add_argument("--recipe", default="smollm2-135m-orin")
    ap.add_argument("--num-tokens", type=int, default=None, help="cut each sequence (default: all recorded)")
    ap.add_argument(
        "--cpu-artifact",
        type=Path,
        default=None,
        help="also run this CPU artifact through the runtime's teacher forcing on the same golden",
    )
    return ap


def rtn_reference(ref4):
    """A copy of the INT4 reference whose 4-bit GEMMs are re-quantized by plain symmetric
    round-to-nearest (absmax/7, fp32 scales) and held as float weights."""
    import copy

    from trtpipe.pipeline.model.reference import FloatLinear, Int4Linear
    from trtpipe.plugins.ops.int4_gemm import pack as P
    from trtpipe.plugins.ops.int4_gemm.reference import dequantize_int4

    def rtn_float(m):
        w = dequantize_int4(m.b_packed.numpy(), m.scales.numpy(), m.zero_points.numpy(), m.K, m.N, m.group_size)
        packed, scales, _ = P.quantize_rtn(w, m.group_size, symmetric=True)
        return FloatLinear(dequantize_int4(packed, scales, None, m.K, m.N, m.group_size))

    ref_rtn = copy.deepcopy(ref4)
    for parent in list(ref_rtn.modules()):
        for name, m in list(parent.named_children()):
            if isinstance(m, Int4Linear) and m.bits == 4:
                setattr(parent, name, rtn_float(m))
    return ref_rtn


def cpu_artifact_agreement(artifact: Path, golden: dict, n: int) -> tuple[int, int]:
    """(agreeing, total) teacher-forced tokens of a CPU artifact through the runtime (ONNX Runtime)."""
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_agreement

    llm = LLM(artifact, num_threads=2)
    agree = total = 0
    for sq in golden["sequences"]:
        want = [int(x) for x in sq["output_ids"][:n]]
        _, preds = teacher_forced_agreement(llm, sq["prompt_ids"], want)
        agree += sum(p == w for p, w in zip(preds, want))
        total += len(want)
    return agree, total


def main() -> int:
    args = _parser().parse_args()
    import torch

    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.stages import load_model
    from trtpipe.pipeline.stages.tensorrt.variant_gate import requantized_reference, teacher_forced_agreement_dense

    torch.set_num_threads(2)
    golden = json.loads(args.golden.read_text())
    n = args.num_tokens or golden["num_tokens"]
    seqs = len(golden["sequences"])
    recipe = load_recipe(resolve_recipe_path(args.recipe))
    loaded = load_model(recipe)
    kw = dict(rope_table_len=recipe.max_seq_len, sliding_window=recipe.sliding_window)
    ref32 = build_reference_model(loaded, "fp32", **kw)
    ref4 = build_reference_model(loaded, "int4", recipe.precision.int4.group_size, False, **kw)
    t = time.perf_counter()
    ref_sym = requantized_reference(ref4)
    print(f"re-quantized (least squares) in {time.perf_counter() - t:.1f} s")
    ref_rtn = rtn_reference(ref4)
    print(f"golden: {args.golden} ({seqs} sequences, {n} tokens each at most; {golden.get('reference')})")
    print(
        "int4 Q4_1 exact (plugin variant, CPU default): the golden's own weights (the fp32 reference IS the "
        "dequantized Q4_1), so 1.0 on this reference by construction; engines differ by their kernels"
    )
    ref_f16 = requantized_reference(ref4, "dequantize_float", weight_dtype="fp16")
    for name, ref in (
        ("fp32 (dequantized GGUF; the golden's own weights)", ref32),
        ("fp16 dequantized (plugin-free: dequantize_float)", ref_f16),
        ("int4 symmetric least-squares (requantize_symmetric)", ref_sym),
        ("int4 symmetric RTN absmax/7 (comparison)", ref_rtn),
    ):
        t = time.perf_counter()
        a = teacher_forced_agreement_dense(ref, golden, seqs, n)
        print(f"{name:55s} {a.agree}/{a.total} = {a.value:.4f}  ({time.perf_counter() - t:.1f} s)")
    if args.cpu_artifact is not None:
        agree, total = cpu_artifact_agreement(args.cpu_artifact, golden, n)
        print(
            f"{'CPU artifact via ONNX Runtime (runtime teacher forcing)':55s} {agree}/{total} = {agree / total:.4f}"
            f"  ({args.cpu_artifact})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
