"""Logits of a GGUF model at a few positions from the layer-by-layer NumPy reference
(pipeline/model/layerwise.py: one layer's fp32 weights at a time), with its wall time and peak
anonymous memory (RssAnon: the memory-mapped file's pages are not counted). The reference side of
issue 44's "engine logits vs the layer-by-layer reference" check at 7B scale.

    python bench/layerwise_logits.py MODEL.gguf [--tokens 64] [--positions 0,7,15,23,31,39,47,63] [--seed 0] [--out F.npz]
        [--artifact DIR [--engine auto|native|ort]]

``--artifact``: the built engine's logits at the same positions (teacher-forced: the prompt is
the first token, then the rest fed one decode step each; runtime/measure/teacher_forcing.py),
their largest difference from the reference and the argmax agreement.

Measured on the synthetic Llama-2-7B shape (3.83 GB Q4_0) on a busy 2-core Zen 3: 418 s wall,
113 s CPU, 1.63 GB peak RssAnon (docs/estimate.md).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import numpy as np


def rss_anon_bytes() -> int:
    """This process's anonymous resident bytes (Linux /proc/self/status RssAnon)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--positions", default="0,7,15,23,31,39,47,63")
    ap.add_argument("--seed", type=int, default=0, help="the random token ids' seed")
    ap.add_argument("--out", type=Path, help="write token_ids, positions, logits (.npz)")
    ap.add_argument("--artifact", type=Path, help="compare a built artifact's engine at the same positions")
    ap.add_argument("--engine", default="auto", help="the runtime engine for --artifact")
    args = ap.parse_args(argv)
    peak = [0]
    running = [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], rss_anon_bytes())
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    from trtpipe.pipeline.model.gguf import load_gguf
    from trtpipe.pipeline.model.layerwise import layerwise_logits

    t0, c0 = time.perf_counter(), time.process_time()
    model = load_gguf(args.model, with_tokenizer=False)
    ids = [int(x) for x in np.random.default_rng(args.seed).integers(0, model.config.vocab_size, args.tokens)]
    positions = [int(p) for p in args.positions.split(",")]
    out = layerwise_logits(model, ids, positions)
    running[0] = False
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{args.model.name}: {model.config.num_layers} layers, {len(ids)} tokens, logits at {positions}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RssAnon {peak[0] / 1e9:.2f} GB, "
          f"largest layer's fp32 weights {out.max_layer_weight_bytes / 1e9:.2f} GB")  # fmt: skip
    print(f"argmax {out.logits.argmax(-1).tolist()}, logits std {out.logits.std():.3f}")
    if args.out:
        np.savez(args.out, token_ids=np.asarray(ids), positions=np.asarray(positions), logits=out.logits)
    if args.artifact:
        compare_engine(args.artifact, args.engine, ids, positions, out.logits)
    return 0


def compare_engine(artifact: Path, engine: str, ids: list[int], positions: list[int], ref: np.ndarray) -> None:
    """Print the engine's largest logit difference from ``ref`` [len(positions), V] and argmax agreement."""
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_logits

    llm = LLM(artifact, engine=engine)
    got = teacher_forced_logits(llm, ids[:1], ids[1:] + [0])[positions]  # row i: the logits at position i
    agree = int((got.argmax(-1) == ref.argmax(-1)).sum())
    print(f"engine {engine} ({artifact}): max abs diff {np.abs(got - ref).max():.4g} on logits up to "
          f"{np.abs(ref).max():.3g}; argmax agrees at {agree}/{len(positions)} positions")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
