#!/usr/bin/env python3
"""What a 4-bit LM head would cost in quality (issue 13's "LM head's form" lever).

    python bench/lm_head_quality.py [--recipe recipes/smollm2-135m-cpu.yaml] [--artifact DIR]

The default INT4 artifact keeps the GGUF's Q8_0 LM head as 8-bit weights (exact: the GGUF's own
numbers), 31.9 MB read per decode token for SmolLM2-135M; a 4-bit head re-quantized from it
(round-to-nearest, group 32) would read 17.7 MB. This script measures the quality side only: the
torch reference of the recipe's INT4 model with each head form (fp32 activations, so the head's
weights are the only difference), teacher-forced over the artifact's fp32 golden outputs
(``golden.json``: greedy tokens of the GGUF's fp32 reference, recorded at build time), the measure
``trtpipe validate`` gates on (>= 0.95 on the default recipe, issue 13). Prints one line per form:
agreeing / total positions. Deterministic; a few seconds per form after the model loads.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "smollm2-135m-cpu.yaml"))
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    a = ap.parse_args()
    golden_path = Path(a.artifact) / "golden.json"
    if not golden_path.is_file():
        raise SystemExit(f"{golden_path} not found. Fix: trtpipe build {Path(a.recipe).stem}")
    from trtpipe.pipeline.model.quantize import QuantSpec
    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.recipe.loading import load_recipe
    from trtpipe.pipeline.stages.load import load_model
    from trtpipe.pipeline.stages.tensorrt.variant_gate import teacher_forced_agreement_dense

    recipe = load_recipe(a.recipe)
    golden = json.loads(golden_path.read_text())
    sequences = golden["sequences"]
    num_tokens = max(len(s["output_ids"]) for s in sequences)
    model = load_model(recipe)
    q = recipe.precision.int4  # the recipe's layers, as its build repacks them
    forms = [
        ("GGUF Q8_0 head, 8-bit exact (default)", None),
        ("4-bit symmetric RTN head, group 32", QuantSpec("int4", 32, True)),
        ("4-bit asymmetric RTN head, group 32", QuantSpec("int4", 32, False)),
        ("fp32 head (dequantized Q8_0)", QuantSpec("fp32")),
    ]
    print(f"{recipe.name}: INT4 layers, {len(sequences)} golden sequences, teacher-forced")
    for name, head in forms:
        t0 = time.perf_counter()
        ref = build_reference_model(model, "int4", q.group_size, q.symmetric, lm_head_quant=head)
        agree = teacher_forced_agreement_dense(ref, golden, len(sequences), num_tokens)
        print(f"  {name}: {agree.agree}/{agree.total} = {agree.value:.3f} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
