#!/usr/bin/env python3
"""Teacher-forced agreement of the onnxruntime-genai peer models with trtpipe's fp32 golden outputs.

    python bench/peer_quality.py [--artifact DIR] [--models-dir .venv-bench/models]

Speed ratios mean little if the engines do not compute the same model. The golden outputs of
the default artifact (``golden.json``: greedy tokens of the fp32 torch reference of the GGUF,
recorded at build time) are fed to each engine teacher-forced, and the share of positions where
the engine's argmax equals the golden token is printed (the measure ``trtpipe validate`` gates
on). trtpipe's own artifact runs through its runtime; the onnxruntime-genai model folders built
by ``bench/peers.py --setup`` run through plain ``onnxruntime`` (the project venv's), one prefill
of prompt + golden tokens with an empty KV cache, whose logits cover every position.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from peers import DEFAULT_ARTIFACT  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".venv-bench" / "models")
    args = ap.parse_args()
    golden = json.loads((args.artifact / "golden.json").read_text())
    seqs = golden["sequences"]
    print(
        f"golden: {len(seqs)} sequences, {sum(len(s['output_ids']) for s in seqs)} tokens "
        f"({golden.get('reference', 'fp32 reference')})"
    )
    rows = [("trtpipe (default artifact)", trtpipe_agreement(args.artifact, seqs))]
    for name in ("ortgenai-int4", "ortgenai-fp32"):
        d = args.models_dir / name
        if (d / "genai_config.json").exists():
            rows.append((name, genai_agreement(d, seqs)))
        else:
            print(f"{name}: not set up ({d}); run `python bench/peers.py --setup`")
    for name, (a, t) in rows:
        print(f"{name:28s} teacher-forced agreement {a}/{t} = {a / t:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
