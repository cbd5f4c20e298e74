#!/usr/bin/env python3
"""Teacher-forced agreement of every peer with trtpipe's fp32 golden outputs.

    python bench/peer_quality.py [--artifact DIR] [--engines a,b] [--bench-dir /work/wt/peers]

Speed ratios mean little if the engines do not compute the same model. The golden outputs of
the default artifact (``golden.json``: greedy tokens of the fp32 torch reference of the GGUF,
recorded at build time) are fed to each engine teacher-forced, and the share of positions where
the engine's argmax equals the golden token is printed (the measure ``trtpipe validate`` gates
on). trtpipe's own artifact runs through its runtime; the onnxruntime-genai model folders built
by ``bench/peers.py --setup`` run through plain ``onnxruntime`` (the project venv's), one prefill
of prompt + golden tokens with an empty KV cache, whose logits cover every position. The other
peers (llama.cpp, OpenVINO int4 sym/asym, vLLM CPU bf16, transformers fp32) run in their own venvs
as workers (bench/peer_quality_workers.py says how each gets every position's logits); a peer that
is not set up or fails gets a line that says why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from peer_quality_workers import RESULT_MARK, worker_main  # noqa: E402
from peers_setup import (  # noqa: E402
    DEFAULT_ARTIFACT,
    ENGINES,
    MODELS_DIR,
    _tail,
    engine_env,
    gguf_path,
    load_setup_state,
    unavailable_reason,
    venv_python,
)

WORKER_ENGINES = ("llama.cpp", "openvino-int4-sym", "openvino-int4-asym", "vllm-bf16", "transformers-fp32")


def genai_agreement(model_dir: Path, sequences: list[dict]) -> tuple[int, int]:
    """(agreeing, total) positions for an onnxruntime-genai model folder (model.onnx)."""
    import onnx
    import onnxruntime as ort

    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_dir / cfg["filename"]), so, providers=["CPUExecutionProvider"])
    m = onnx.load(str(model_dir / cfg["filename"]), load_external_data=False)
    kv_type = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
    agree = total = 0
    for s in sequences:
        prompt, want = list(s["prompt_ids"]), [int(t) for t in s["output_ids"]]
        ids = np.asarray([prompt + want[:-1]], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        for i in sess.get_inputs():
            if i.name.startswith("past_key_values"):
                dt = np.float16 if kv_type[i.name] == onnx.TensorProto.FLOAT16 else np.float32
                feeds[i.name] = np.zeros((1, cfg["num_key_value_heads"], 0, cfg["head_size"]), dt)
        logits = sess.run(["logits"], feeds)[0][0]  # [T, V]
        preds = logits[len(prompt) - 1 :].argmax(-1).tolist()
        agree += sum(p == w for p, w in zip(preds, want))
        total += len(want)
    return agree, total


def trtpipe_agreement(artifact: Path, sequences: list[dict]) -> tuple[int, int]:
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.measure.teacher_forcing import teacher_forced_agreement

    llm = LLM(artifact, num_threads=2)
    agree = total = 0
    for s in sequences:
        want = [int(t) for t in s["output_ids"]]
        _, preds = teacher_forced_agreement(llm, s["prompt_ids"], want)
        agree += sum(p == w for p, w in zip(preds, want))
        total += len(want)
    return agree, total


def peer_agreement(engine: str, sequences: list[dict], threads: int = 2, timeout_s: float = 900) -> tuple[int, int]:
    """(agreeing, total) from a worker in ``engine``'s venv. Raises RuntimeError saying why not."""
    spec = ENGINES[engine]
    why = unavailable_reason(spec, load_setup_state())
    if why:
        raise RuntimeError(why)
    with tempfile.TemporaryDirectory(prefix="trtpipe-pq-") as tmp:
        f = Path(tmp) / "spec.json"
        payload = {"sequences": sequences, "models_dir": str(MODELS_DIR), "threads": threads}
        f.write_text(json.dumps(payload | {"gguf": str(gguf_path())}))
        cmd = [str(venv_python(spec.venv)), str(Path(__file__).resolve()), "--worker", engine, "--spec", str(f)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=engine_env(spec, threads))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"worker timed out after {timeout_s:.0f} s") from None
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            r = json.loads(line[len(RESULT_MARK) :])
            return r["agree"], r["total"]
    raise RuntimeError(f"worker exit {p.returncode}: {_tail(p.stderr or p.stdout)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--models-dir", type=Path, default=MODELS_DIR, help="the ortgenai model folders")
    ap.add_argument("--engines", default=",".join(("trtpipe", "ortgenai-int4", "ortgenai-fp32", *WORKER_ENGINES)))
    ap.add_argument("--bench-dir", type=Path, help="the folder holding the peers' venvs (as bench/peers.py)")
    ap.add_argument("--max-sequences", type=int, help="only the first N golden sequences (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write {engine: {agree, total} or {error}} here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args.worker, args.spec)
    if args.bench_dir and str(args.bench_dir.resolve()) != os.environ.get("TRTPIPE_BENCH_DIR"):
        os.environ["TRTPIPE_BENCH_DIR"] = str(args.bench_dir.resolve())
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
    golden = json.loads((args.artifact / "golden.json").read_text())
    seqs = golden["sequences"][: args.max_sequences]
    print(
        f"golden: {len(seqs)} sequences, {sum(len(s['output_ids']) for s in seqs)} tokens "
        f"({golden.get('reference', 'fp32 reference')})"
    )
    results: dict[str, dict] = {}
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        try:
            if name == "trtpipe":
                a, t = trtpipe_agreement(args.artifact, seqs)
            elif name.startswith("ortgenai-"):
                d = args.models_dir / name
                if not (d / "genai_config.json").exists():
                    raise RuntimeError(f"not set up ({d}); run `python bench/peers.py --setup`")
                a, t = genai_agreement(d, seqs)
            else:
                a, t = peer_agreement(name, seqs)
        except (RuntimeError, KeyError) as e:
            print(f"{name:28s} not measured: {e}", flush=True)
            results[name] = {"error": str(e)[:800]}
            continue
        print(f"{name:28s} teacher-forced agreement {a}/{t} = {a / t:.4f}", flush=True)
        results[name] = {"agree": a, "total": t}
    if args.json:
        args.json.write_text(json.dumps({"sequences": len(seqs), "engines": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
