"""KV cache dtypes at long context: TPOT, KV bytes and agreement of fp32 / fp16 / bf16 / int8 pools.

Four artifacts of ``recipes/smollm2-135m-cpu-long.yaml`` (INT4, native engine, 8192-token context)
that differ only in ``kv_cache.dtype``: their recipes are derived into
``artifacts/.cache/kv_dtype/recipes/`` and built by ``--build`` (``trtpipe build <that file>``).
They are loaded in one process and, for each context L (default 8127 prompt tokens, so the 64
decode steps run at 8127..8190 tokens: the model's whole context), measured back to back in
each round, the order alternating between rounds:

- TTFT: wall time of the steps until the first new token (512-token prefill chunks), s; round 0
  only: later rounds take the prompt's blocks from the prefix cache (on, so that a round costs
  its 64 decode steps, not another 8K prefill; the decode steps read the same pool either way).
- TPOT: median wall time of the 64 decode steps through the scheduler, ms, and its ratio to the
  fp32 pool's in the same round.
- KV bytes: the pool's bytes per token (K and V of every layer, int8 scales included) x the
  context, and the ratio to fp32.
- Scale granularity (unless ``--timing-only``): the relative RMS error of real K / V (the fp32
  pool's last context) quantized to int8 per token and kv head (what the pool stores) and per
  16-token block and kv head.
- Agreement (unless ``--timing-only``): teacher-forced top-1 agreement over the 64 positions after
  the prompt, against the full-attention fp32 reference (``pipeline/model/reference/``
  ``forward_dense``, one pass, minutes: cached in ``artifacts/.cache/kv_dtype_reference.npz``) and
  against the fp32-pool artifact itself (the KV dtype's own cost, INT4's left out).

Text: the GNU GPL v3 followed by the GFDL 1.3 (as bench/long_context.py). Time it under the
exclusive lock, ``flock -x /tmp/trtpipe-heavy.lock python bench/kv_dtype.py --timing-only``; the
agreement pass is deterministic and can run under the shared lock (``--rounds 0``).

Usage: ``python bench/kv_dtype.py [--build] [--contexts 8127] [--rounds 3] [--timing-only] [--out F]``
(``--rounds 0``: the agreement only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_context import DEFAULT_TEXT, NUM_NEW, load_text_ids, reference_argmax, timed_request  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE_RECIPE = REPO / "recipes" / "smollm2-135m-cpu-long.yaml"
CACHE = REPO / "artifacts" / ".cache"
DTYPES = ("fp32", "fp16", "bf16", "int8")


def recipe_path(kv_dtype: str) -> Path:
    """The long-context recipe with ``kv_cache.dtype: kv_dtype`` (written when missing or stale)."""
    name = f"smollm2-135m-cpu-long-kv-{kv_dtype}"
    text = BASE_RECIPE.read_text()
    for old, new in (
        ("name: smollm2-135m-cpu-long\n", f"name: {name}\n"),
        ("  dtype: fp32\n", f"  dtype: {kv_dtype}\n"),
    ):
        if old not in text:
            raise SystemExit(f"{BASE_RECIPE} has no line {old.strip()!r}: update recipe_path() in {__file__}")
        text = text.replace(old, new, 1)
    path = CACHE / "kv_dtype" / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def artifact_dir(kv_dtype: str) -> Path:
    return REPO / "artifacts" / f"smollm2-135m-cpu-long-kv-{kv_dtype}" / "cpu"


def measure(llms: dict, ids: list[int], L: int, rounds: int) -> list[dict]:
    """Timing rows of one context length: ``rounds`` rounds, the dtypes back to back in each, the
    order alternating."""
    rows: list[dict] = []
    for r in range(rounds):
        order = list(llms) if r % 2 == 0 else list(llms)[::-1]
        for name in order:
            llm = llms[name]
            per_token = llm.pool.nbytes / (llm.block_pool.num_blocks * llm.manifest.kv.block_size)
            row = {"kv_dtype": name, "round": r, "context_tokens": L} | timed_request(llm, ids[:L])
            row["ttft_ms"] = row["ttft_ms"] if r == 0 else None  # later rounds: a prefix-cache hit
            row["kv_bytes_per_token"] = per_token
            row["kv_mib_at_8192"] = round(per_token * 8192 / 2**20, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def agreement(llms: dict, ids: list[int], L: int, ref: np.ndarray) -> list[dict]:
    """Teacher-forced top-1 agreement over the 64 positions after ``ids[:L]`` of each dtype,
    against the fp32 reference's argmax and against the fp32 pool's predictions."""
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_agreement

    preds = {
        name: np.asarray(teacher_forced_agreement(llm, ids[:L], ids[L : L + NUM_NEW])[1]) for name, llm in llms.items()
    }
    rows = [
        {
            "kv_dtype": name,
            "context_tokens": L,
            "agreement_vs_fp32_reference": round(float(np.mean(p == ref[L - 1 : L - 1 + NUM_NEW])), 3),
            "agreement_vs_fp32_kv": round(float(np.mean(p == preds["fp32"])), 3),
        }
        for name, p in preds.items()
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def scale_study(llm) -> dict:
    """int8 scale granularity on real K/V: the blocks the fp32-pool artifact wrote (the last
    request's whole context), quantized per token and kv head (what the pool stores) and per
    block and kv head (one scale for 16 tokens x 64 dims). Returns the relative RMS error
    ``||x' - x|| / ||x||`` of K and of V, over all layers, for each."""
    from trtpipe.plugins.core.kv_codec import kv_decode, kv_encode

    err = {
        ("token", "K"): [0.0, 0.0],
        ("token", "V"): [0.0, 0.0],
        ("block", "K"): [0.0, 0.0],
        ("block", "V"): [0.0, 0.0],
    }
    for name, arrays in (("K", llm.pool.keys), ("V", llm.pool.values)):
        for a in arrays:  # [KVH, NB, BS, D] float32
            x = a[:, np.abs(a).reshape(a.shape[0], a.shape[1], -1).max(axis=(0, 2)) > 0]  # written blocks
            per_token = kv_decode(*kv_encode(x, "int8"), "int8")
            amax = np.abs(x).max(axis=(2, 3), keepdims=True)  # [KVH, nb, 1, 1]
            step = np.where(amax > 0, amax / np.float32(127), np.float32(1))
            per_block = np.clip(np.rint(x / step), -127, 127) * step
            for kind, y in (("token", per_token), ("block", per_block)):
                err[(kind, name)][0] += float(np.sum((y - x) ** 2))
                err[(kind, name)][1] += float(np.sum(x**2))
    return {f"{kind}_{n}_rel_rms": round((e / t) ** 0.5, 5) for (kind, n), (e, t) in err.items()}


def table(rows: list[dict]) -> str:
    """The markdown tables: timing per round with ratios to that round's fp32 row; agreement."""
    timing = [r for r in rows if "tpot_ms" in r]
    fp32 = {(r["round"], r["context_tokens"]): r for r in timing if r["kv_dtype"] == "fp32"}
    out = [
        "| context | KV dtype | round | TTFT s | TPOT ms (p50 / p90) | TPOT / fp32 | KV MiB at 8192 | KV / fp32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in timing:
        base = fp32[(r["round"], r["context_tokens"])]
        out.append(
            f"| {r['context_tokens']} | {r['kv_dtype']} | {r['round']} | "
            f"{'-' if r['ttft_ms'] is None else format(r['ttft_ms'] / 1e3, '.1f')} | "
            f"{r['tpot_ms']:.1f} / {r['tpot_p90_ms']:.1f} | {r['tpot_ms'] / base['tpot_ms']:.2f} | "
            f"{r['kv_mib_at_8192']:.0f} | {r['kv_bytes_per_token'] / base['kv_bytes_per_token']:.3f} |"
        )
    agree = [r for r in rows if "agreement_vs_fp32_reference" in r]
    if agree:
        out += ["", "| context | KV dtype | agreement vs fp32 reference | vs the fp32 pool |", "|---|---|---|---|"]
        out += [
            f"| {r['context_tokens']} | {r['kv_dtype']} | {r['agreement_vs_fp32_reference']:.3f} | "
            f"{r['agreement_vs_fp32_kv']:.3f} |"
            for r in agree
        ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="8127", help="prompt lengths, comma-separated (<= 8127)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, order alternating (0: agreement only)")
    ap.add_argument("--build", action="store_true", help="build the missing artifacts first (trtpipe build)")
    ap.add_argument("--timing-only", action="store_true", help="skip the reference pass and the agreement")
    ap.add_argument("--text-file", action="append", default=None, help="text file(s) to read (repeat)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    for d in DTYPES:
        if not (artifact_dir(d) / "manifest.json").is_file():
            cmd = ["trtpipe", "build", str(recipe_path(d))]
            if not a.build:
                raise SystemExit(f"artifact {artifact_dir(d)} missing. Fix: {' '.join(cmd)} (or pass --build)")
            # the CLI of this interpreter's environment: an unactivated venv has no trtpipe on PATH
            run = [sys.executable, "-c", "from trtpipe.pipeline.cli.main import main; main()", *cmd[1:]]
            subprocess.run(run, check=True, cwd=REPO)
    from trtpipe.runtime.llm import LLM

    llms = {d: LLM(artifact_dir(d), prefix_caching=True, engine="native") for d in DTYPES}
    contexts = [int(x) for x in a.contexts.split(",")]
    need = max(contexts) + NUM_NEW
    ids = load_text_ids(artifact_dir("fp32") / "tokenizer.json", a.text_file or list(DEFAULT_TEXT), need)[:need]
    max_seq_len = int(llms["fp32"].manifest.limits.max_seq_len)
    ref = None if a.timing_only else reference_argmax(ids, max_seq_len, CACHE / "kv_dtype_reference.npz")
    rows = [row for L in contexts for row in measure(llms, ids, L, a.rounds)]
    if ref is not None:
        rows += [row for L in contexts for row in agreement(llms, ids, L, ref)]
    print()
    print(table(rows))
    if not a.timing_only:  # the fp32 pool now holds the last request's K/V
        study = scale_study(llms["fp32"])
        print(f"\nint8 scale granularity, relative RMS error of K / V over {contexts[-1]} tokens: {json.dumps(study)}")
        rows.append({"scale_study": study})
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
