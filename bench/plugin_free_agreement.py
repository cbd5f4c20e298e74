#!/usr/bin/env python3
"""Teacher-forced agreement of the INT4 weight forms trtpipe builds, against the fp32 golden outputs.

    python bench/plugin_free_agreement.py [--golden artifacts/smollm2-135m-cpu/cpu/golden.json]
                                          [--recipe smollm2-135m-orin] [--num-tokens N]

Runs the torch reference (fp32 activations, CPU) of the recipe's model, teacher-forced over the
golden sequences (pipeline/variant_agreement.py), with each weight form:

- fp32: the dequantized weights the golden outputs come from (a check of the method: ~1.0);
- int4 Q4_1 exact: what the plugin variant and the CPU default run (GGUF Q4_1 blocks as is);
- int4 symmetric, least squares (the plugin-free variant's weights: engine.plugin_free_int4:
  requantize_symmetric), and plain round-to-nearest symmetric (absmax/7) for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", type=Path, default=ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu" / "golden.json")
    ap.add_argument("--recipe", default="smollm2-135m-orin")
    ap.add_argument("--num-tokens", type=int, default=None, help="cut each sequence (default: all recorded)")
    args = ap.parse_args()
    import copy

    import numpy as np
    import torch

    from trtpipe.pipeline.build import load_model
    from trtpipe.pipeline.model import Int4Linear, build_reference_model
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.variant_agreement import (requantized_reference, teacher_forced_agreement_dense)
    from trtpipe.plugins import int4_pack as P
    from trtpipe.plugins.reference import dequantize_int4

    torch.set_num_threads(2)
    golden = json.loads(args.golden.read_text())
    n = args.num_tokens or golden["num_tokens"]
    seqs = len(golden["sequences"])
    recipe = load_recipe(resolve_recipe_path(args.recipe))
    loaded = load_model(recipe)
    kw = dict(rope_table_len=recipe.max_seq_len, sliding_window=recipe.sliding_window)
    g = recipe.precision.int4.group_size
    ref32 = build_reference_model(loaded, "fp32", **kw)
    ref4 = build_reference_model(loaded, "int4", g, False, **kw)
    t = time.perf_counter()
    ref_sym = requantized_reference(ref4)
    print(f"re-quantized (least squares) in {time.perf_counter() - t:.1f} s")
    ref_rtn = copy.deepcopy(ref4)
    for m in ref_rtn.modules():
        if isinstance(m, Int4Linear) and m.bits == 4:
            w = dequantize_int4(m.b_packed.numpy(), m.scales.numpy(), m.zero_points.numpy(), m.K, m.N, m.group_size)
            packed, scales, _ = P.quantize_rtn(w, m.group_size, symmetric=True)
            m.b_packed, m.scales = torch.from_numpy(packed), torch.from_numpy(scales)
            m.zero_points = torch.full_like(m.zero_points, 8.0)
    print(f"golden: {args.golden} ({seqs} sequences, {n} tokens each at most; {golden.get('reference')})")
    for name, ref in (("fp32 (dequantized GGUF; the golden's own weights)", ref32),
                      ("int4 Q4_1 exact (plugin variant, CPU default)", ref4),
                      ("int4 symmetric least-squares (plugin-free variant)", ref_sym),
                      ("int4 symmetric RTN absmax/7 (comparison)", ref_rtn)):
        t = time.perf_counter()
        a = teacher_forced_agreement_dense(ref, golden, seqs, n)
        print(f"{name:55s} {a.agree}/{a.total} = {a.value:.4f}  ({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
