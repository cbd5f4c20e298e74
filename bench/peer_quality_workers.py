"""bench/peer_quality.py, the workers: each peer's teacher-forced next-token predictions, computed in
the peer's own venv (``peer_quality.py --worker ENGINE --spec F`` prints one JSON line).

For each golden sequence (prompt ids + the fp32 reference's greedy output ids ``want``) a worker
returns the peer's argmax after every prefix ``prompt + want[:k]``, k = 0..len(want)-1, from one
pass over ``prompt + want[:-1]`` that yields the logits of every position:

- llama.cpp: llama-cpp-python ``Llama(logits_all=True).eval`` on the Q4_1 GGUF (the host-ISA build);
- transformers: a forward pass of the dequantized GGUF in fp32;
- OpenVINO: optimum-intel's ``OVModelForCausalLM`` forward on the exported int4 IR (the same CPU
  plugin kernels OpenVINO GenAI runs);
- vLLM: ``LLM.generate`` with ``prompt_logprobs=1``: every prompt position's rank-1 token, plus
  the one greedy token after the whole sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULT_MARK = "@@peer-quality@@ "


def _llama_cpp(spec: dict, seqs: list[dict]) -> list[list[int]]:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=spec["gguf"], n_ctx=2048, logits_all=True, n_threads=spec["threads"], verbose=False)
    preds = []
    for s in seqs:
        ids = list(s["prompt_ids"]) + [int(t) for t in s["output_ids"]][:-1]
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)])
        preds.append(logits[len(s["prompt_ids"]) - 1 :].argmax(-1).tolist())
    return preds


def _transformers(spec: dict, seqs: list[dict]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    m = AutoModelForCausalLM.from_pretrained(str(Path(spec["models_dir"]) / "hf-from-gguf"), dtype=torch.float32)
    preds = []
    with torch.inference_mode():
        for s in seqs:
            ids = list(s["prompt_ids"]) + [int(t) for t in s["output_ids"]][:-1]
            logits = m(input_ids=torch.tensor([ids])).logits[0]
            preds.append(logits[len(s["prompt_ids"]) - 1 :].argmax(-1).tolist())
    return preds


def _openvino(spec: dict, seqs: list[dict], kind: str) -> list[list[int]]:
    import torch
    from optimum.intel import OVModelForCausalLM

    d = Path(spec["models_dir"]) / f"openvino-int4-{kind}"
    m = OVModelForCausalLM.from_pretrained(str(d), ov_config={"INFERENCE_NUM_THREADS": str(spec["threads"])})
    preds = []
    for s in seqs:
        ids = torch.tensor([list(s["prompt_ids"]) + [int(t) for t in s["output_ids"]][:-1]], dtype=torch.long)
        logits = m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        if logits.shape[0] != ids.shape[1]:
            raise RuntimeError(f"OpenVINO returned logits for {logits.shape[0]} of {ids.shape[1]} positions")
        preds.append(logits[len(s["prompt_ids"]) - 1 :].argmax(-1).tolist())
    return preds


def _vllm(spec: dict, seqs: list[dict]) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    hf = Path(spec["models_dir"]) / "hf-from-gguf"
    llm = LLM(model=str(hf), dtype="bfloat16", max_model_len=2048, seed=0, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": list(s["prompt_ids"]) + [int(t) for t in s["output_ids"]][:-1]} for s in seqs]
    preds = []
    for s, o in zip(seqs, llm.generate(prompts, params)):
        n = len(s["prompt_ids"])
        # prompt_logprobs[j]: {token: Logprob(rank)} for position j, the top-1 among them
        ranked = [min(d.items(), key=lambda kv: kv[1].rank)[0] for d in o.prompt_logprobs[n:]]
        preds.append(ranked + [o.outputs[0].token_ids[0]])
    return preds


WORKERS = {
    "llama.cpp": _llama_cpp,
    "transformers-fp32": _transformers,
    "openvino-int4-sym": lambda spec, seqs: _openvino(spec, seqs, "sym"),
    "openvino-int4-asym": lambda spec, seqs: _openvino(spec, seqs, "asym"),
    "vllm-bf16": _vllm,
}


def agreement(preds: list[list[int]], seqs: list[dict]) -> tuple[int, int]:
    """(positions where the prediction equals the golden token, positions)."""
    agree = total = 0
    for p, s in zip(preds, seqs):
        want = [int(t) for t in s["output_ids"]]
        if len(p) != len(want):
            raise ValueError(f"{len(p)} predictions for {len(want)} golden tokens")
        agree += sum(int(a) == b for a, b in zip(p, want))
        total += len(want)
    return agree, total


def worker_main(engine: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    seqs = spec["sequences"]
    a, t = agreement(WORKERS[engine](spec, seqs), seqs)
    print(RESULT_MARK + json.dumps({"engine": engine, "agree": a, "total": t}), flush=True)
    return 0
