"""Long context on the CPU: a 2048-token sliding window against full attention, as in the seed
article's Orin experiment (../shared/SEED_NOTES.md: a 2048-token window cut TPOT from 62 to
41 ms/token on 10K-token generation).

Two artifacts of the same model that differ only in ``sliding_window``
(recipes/smollm2-135m-cpu-long.yaml and recipes/smollm2-135m-cpu-long-sw2048.yaml, both
max_seq_len 8192 = SmolLM2's context) are loaded in one process and measured interleaved, for
each context length L (default 1024, 4096, 8064 prompt tokens + 64 new):

- TTFT: wall time of the steps until the first new token (the prompt is prefilled in chunks of
  max_num_tokens = 512, as the scheduler does), ms.
- TPOT: median wall time of the 64 decode steps, ms.
- KV held: the most KV blocks the sequence held during decode x bytes per block, MiB (the window
  frees blocks that left it: at most ceil(2048 / 16) + 1 = 129 blocks).
- Agreement: teacher-forced top-1 agreement over the 64 positions after the prompt with the
  **full-attention fp32 reference** (pipeline/model/reference/ ``forward_dense`` on the same tokens, one
  pass over the whole text): the window's quality cost, since SmolLM2 was trained without one.

Prefix caching is off (every L reuses the same text). The text is natural English: the GNU GPL
v3 followed by the GFDL 1.3 (``/usr/share/common-licenses`` on Debian; ``--text-file`` for
another). Positions beyond the RoPE table (8192) stay refused by the runtime.

Usage: ``python bench/long_context.py [--contexts 1024,4096,8064] [--out report.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = {
    "full": REPO / "artifacts" / "smollm2-135m-cpu-long" / "cpu",
    "sw2048": REPO / "artifacts" / "smollm2-135m-cpu-long-sw2048" / "cpu",
}
DEFAULT_TEXT = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GFDL-1.3")
NUM_NEW = 64


def load_text_ids(tokenizer_json: Path, paths: list[str], need: int) -> list[int]:
    """Token ids (no BOS) of the concatenated text files; SystemExit when shorter than ``need``."""
    from tokenizers import Tokenizer

    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise SystemExit(f"--text-file: {missing} not found. Fix: pass English text files with >= {need} tokens")
    text = "\n\n".join(Path(p).read_text(encoding="utf-8") for p in paths)
    ids = Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids
    if len(ids) < need:
        raise SystemExit(f"the text has {len(ids)} tokens; need {need}. Fix: add --text-file files")
    return ids


def reference_argmax(ids: list[int], max_seq_len: int, cache: Path) -> np.ndarray:
    """argmax of the full-attention fp32 reference at every position of ``ids`` ([T] int64),
    from one dense forward pass (pipeline/model/reference/; minutes at 8K tokens on 2 cores). Kept in
    ``cache`` (.npz with the ids) and reused while the ids are the same."""
    import torch

    if cache.is_file():
        z = np.load(cache)
        if np.array_equal(z["ids"], np.asarray(ids)):
            return z["argmax"]

    from trtpipe.pipeline.model.reference import build_reference_model
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.pipeline.stages import load_model

    loaded = load_model(load_recipe(REPO / "recipes" / "smollm2-135m-cpu-long.yaml"))
    ref = build_reference_model(loaded, "fp32", rope_table_len=max_seq_len)
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = ref.forward_dense(torch.tensor([ids], dtype=torch.int64))[0]
        out = logits.argmax(-1).numpy()
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, ids=np.asarray(ids), argmax=out)
    print(f"reference: {len(ids)} tokens in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def timed_request(llm, prompt: list[int]) -> dict:
    """TTFT / TPOT / KV blocks held for one request through the scheduler (ignore_eos)."""
    from trtpipe.runtime.sample.params import SamplingParams

    rid = llm.add_request(prompt, SamplingParams(max_new_tokens=NUM_NEW + 1, ignore_eos=True))
    t = time.perf_counter()
    while True:
        llm.step()
        part = llm.partial_output(rid)
        if part is None or part.output_token_ids:
            break
    ttft = time.perf_counter() - t
    steps, held = [], 0
    while llm.has_unfinished():
        t = time.perf_counter()
        llm.step()
        steps.append(time.perf_counter() - t)
        held = max(held, llm.block_pool.num_used)
    block_bytes = llm.pool.nbytes // llm.block_pool.num_blocks
    return {
        "ttft_ms": round(ttft * 1e3, 1),
        "tpot_ms": round(statistics.median(steps) * 1e3, 2),
        "tpot_p90_ms": round(sorted(steps)[int(0.9 * len(steps))] * 1e3, 2),
        "kv_blocks_held": held,
        "kv_held_mib": round(held * block_bytes / 2**20, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1024,4096,8064", help="prompt lengths, comma-separated")
    ap.add_argument("--text-file", action="append", default=None, help="text file(s) to read (repeat)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument(
        "--timing-only", action="store_true", help="skip the reference pass and the agreement (a quick timing rerun)"
    )
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_agreement

    for name, path in ARTIFACTS.items():
        if not (path / "manifest.json").is_file():
            raise SystemExit(f"artifact {name} missing at {path}. Fix: trtpipe build {path.parent.name}")
    llms = {name: LLM(path, prefix_caching=False) for name, path in ARTIFACTS.items()}
    max_seq_len = int(llms["full"].manifest.limits.max_seq_len)
    need = max(contexts) + NUM_NEW
    ids = load_text_ids(ARTIFACTS["full"] / "tokenizer.json", a.text_file or list(DEFAULT_TEXT), need)[:need]
    ref = (
        None
        if a.timing_only
        else reference_argmax(ids, max_seq_len, REPO / "artifacts" / ".cache" / "long_context_reference.npz")
    )
    rows = []
    for i, L in enumerate(contexts):
        # interleaved: same L, both artifacts back to back, the order alternating with L
        for name in list(llms) if i % 2 == 0 else list(llms)[::-1]:
            llm = llms[name]
            row = {"artifact": name, "context_tokens": L} | timed_request(llm, ids[:L])
            row["agreement_vs_full_fp32"] = None
            if ref is not None:
                _, preds = teacher_forced_agreement(llm, ids[:L], ids[L : L + NUM_NEW])
                agree = int(np.sum(np.asarray(preds) == ref[L - 1 : L - 1 + NUM_NEW]))
                row["agreement_vs_full_fp32"] = round(agree / NUM_NEW, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| context | attention | TTFT ms | TPOT ms (p50 / p90) | KV held MiB (blocks) | agreement vs full fp32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['context_tokens']} | {r['artifact']} | {r['ttft_ms']:.0f} | {r['tpot_ms']:.1f} / "
            f"{r['tpot_p90_ms']:.1f} | {r['kv_held_mib']:.0f} ({r['kv_blocks_held']}) | "
            f"{'-' if r['agreement_vs_full_fp32'] is None else format(r['agreement_vs_full_fp32'], '.3f')} |"
        )
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
