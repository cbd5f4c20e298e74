"""bench/peers.py, the worker side: one adapter per engine, run in its own process
(``peers.py --worker ENGINE --spec F``): load once, warm up on other windows of the text with the
same shapes, measure, print one JSON line after :data:`RESULT_MARK`. Heavy imports stay inside the
adapters (the peers' venv has no trtpipe; trtpipe's has no peers).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

from peers_anchors import OpenVinoAdapter, OpenVinoAsymAdapter, VllmAdapter
from peers_workload import PROMPT_LENGTHS, RESULT_MARK
from serve_proc import process_tree_cpu_s


class _Adapter:
    """``run_one(ids, n) -> (ttft_s, tpot_s, out_ids)``; ``run_many(list_of_ids, n) -> (wall_s, outs)``."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.threads = int(spec["threads"])

    def versions(self) -> dict:
        return {}

    def extra(self) -> dict:
        return {}


class TrtpipeAdapter(_Adapter):
    def load(self, artifact: str | None = None) -> None:
        from trtpipe.runtime.llm import LLM
        from trtpipe.runtime.sample.params import SamplingParams

        self.SamplingParams = SamplingParams
        self.rss_after_import = _rss_bytes()
        artifact = artifact or self.spec["artifact"]
        self.llm = LLM(artifact, num_threads=self.threads, engine=self.spec.get("engine", "auto"))
        self.rss_after_load = _rss_bytes()
        self.rss_file_after_load = _rss_bytes("RssFile")

    def _params(self, n: int):
        return self.SamplingParams(max_new_tokens=n, ignore_eos=True)

    def run_one(self, ids, n):
        t0 = time.monotonic()
        self.llm.add_request(list(ids), self._params(n), arrival_s=t0)
        (out,) = self.llm.run_until_done()
        return out.metrics.ttft_s, out.metrics.tpot_s, list(out.output_token_ids)

    def run_many(self, prompts, n):
        t0 = time.monotonic()
        rids = [self.llm.add_request(list(p), self._params(n), arrival_s=t0) for p in prompts]
        by_id = {o.request_id: o for o in self.llm.run_until_done()}
        wall = time.monotonic() - t0
        self._loaded = [by_id[r].metrics for r in rids]
        return wall, [list(by_id[r].output_token_ids) for r in rids]

    def versions(self):
        import onnxruntime

        m = self.llm.manifest
        return {
            "trtpipe": m.trtpipe_version,
            "onnxruntime": onnxruntime.__version__,
            "package": _dist_name("onnxruntime-gpu", "onnxruntime"),
            "recipe": f"{m.recipe_name} (prefill {m.graphs['prefill'].precision}, "
            f"decode {m.graphs['decode'].precision}; built {m.build_info.get('built_at', '?')})",
        }

    def extra(self):
        m = self.llm.manifest
        weights = m.path(m.runtime_options.get("shared_data_file") or "weights.data")
        loaded = getattr(self, "_loaded", [])
        return {
            "weights_bytes": os.path.getsize(weights),
            "kv_pool_bytes": int(self.llm.pool.nbytes),
            "rss_after_import_bytes": self.rss_after_import,
            "rss_after_load_bytes": self.rss_after_load,
            "rss_file_after_load_bytes": self.rss_file_after_load,
            "rss_file_end_bytes": _rss_bytes("RssFile"),
            "rss_anon_end_bytes": _rss_bytes("RssAnon"),
            "concurrent_ttft_s": [x.ttft_s for x in loaded],
            "concurrent_tpot_s": [x.tpot_s for x in loaded],
        }


class LlamaCppAdapter(_Adapter):
    def load(self, **overrides) -> None:
        """``llama_cpp.Llama`` on the GGUF; ``overrides`` replace or add constructor arguments."""
        from llama_cpp import Llama

        kw = dict(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=self.threads, n_threads_batch=self.threads)
        self.llm = Llama(model_path=self.spec["gguf"], **(kw | {"verbose": False} | overrides))

    def run_one(self, ids, n):
        # reset(): llama-cpp-python's generate() would otherwise reuse the KV of a matching prefix.
        self.llm.reset()
        times, out = [], []
        t0 = time.perf_counter()
        for tok in self.llm.generate(
            list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            times.append(time.perf_counter())
            out.append(int(tok))
            if len(out) >= n:
                break
        return times[0] - t0, (times[-1] - times[0]) / (n - 1) if n > 1 else None, out

    def run_many(self, prompts, n):
        t0 = time.perf_counter()
        outs = [self.run_one(p, n)[2] for p in prompts]  # no multi-sequence batch in the Python API
        return time.perf_counter() - t0, outs

    def versions(self):
        import llama_cpp

        return {"llama-cpp-python": llama_cpp.__version__, "libllama": os.environ.get("LLAMA_CPP_LIB_PATH", "its own")}


class OrtGenaiAdapter(_Adapter):
    precision = "int4"

    def load(self) -> None:
        import numpy as np
        import onnxruntime_genai as og

        self.np, self.og = np, og
        d = Path(self.spec["models_dir"]) / f"ortgenai-{self.precision}"
        cfg_path = d / "genai_config.json"
        cfg = json.loads(cfg_path.read_text())
        so = cfg["model"]["decoder"].setdefault("session_options", {})
        if so.get("intra_op_num_threads") != self.threads or so.get("inter_op_num_threads") != 1:
            so["intra_op_num_threads"], so["inter_op_num_threads"] = self.threads, 1
            cfg_path.write_text(json.dumps(cfg, indent=4))
        self.model = og.Model(str(d))

    def _generate(self, batch, n):
        og, np = self.og, self.np
        length = len(batch[0]) + n
        t0 = time.perf_counter()
        params = og.GeneratorParams(self.model)
        # min_length = max_length: EOS is masked until the end, like ignore_eos.
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(batch))
        g = og.Generator(self.model, params)
        g.append_tokens(np.asarray(batch, dtype=np.int32))  # runs the prefill
        times = []
        while not g.is_done():
            g.generate_next_token()  # first call: samples from the prefill logits; then decode + sample
            times.append(time.perf_counter())
        outs = [list(map(int, g.get_sequence(i)[len(batch[0]) :])) for i in range(len(batch))]
        return t0, times, outs

    def run_one(self, ids, n):
        t0, times, outs = self._generate([list(ids)], n)
        return times[0] - t0, (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None, outs[0]

    def run_many(self, prompts, n):
        t0, times, outs = self._generate([list(p) for p in prompts], n)
        return times[-1] - t0, outs

    def versions(self):
        import onnxruntime

        return {"onnxruntime-genai": self.og.__version__, "onnxruntime": onnxruntime.__version__}


class OrtGenaiFp32Adapter(OrtGenaiAdapter):
    precision = "fp32"


class TransformersAdapter(_Adapter):
    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.generation.streamers import BaseStreamer

        torch.set_num_threads(self.threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(Path(self.spec["models_dir"]) / "hf-from-gguf"), dtype=torch.float32
        ).eval()

        class Stamps(BaseStreamer):  # generate() calls put() with the prompt, then once per token
            def __init__(self):
                self.t = []

            def put(self, value):
                self.t.append(time.perf_counter())

            def end(self):
                pass

        self.Stamps = Stamps

    def _generate(self, batch, n, streamer=None):
        torch = self.torch
        x = torch.tensor(batch, dtype=torch.long)
        with torch.inference_mode():
            y = self.model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=2,
                streamer=streamer,
            )
        return [list(map(int, row[x.shape[1] :])) for row in y]

    def run_one(self, ids, n):
        s = self.Stamps()
        t0 = time.perf_counter()
        out = self._generate([list(ids)], n, s)[0]
        times = s.t[1:]
        return times[0] - t0, (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None, out

    def run_many(self, prompts, n):
        t0 = time.perf_counter()
        outs = self._generate([list(p) for p in prompts], n)
        return time.perf_counter() - t0, outs

    def versions(self):
        import torch
        import transformers

        return {"transformers": transformers.__version__, "torch": torch.__version__}


class TrtpipeFastAdapter(TrtpipeAdapter):
    """The fast recipe's artifact (``spec["artifact_fast"]``), run exactly as the default's."""

    def load(self) -> None:
        super().load(self.spec["artifact_fast"])


ADAPTERS = {
    "trtpipe": TrtpipeAdapter,
    "trtpipe-fast": TrtpipeFastAdapter,
    "llama.cpp": LlamaCppAdapter,
    "ortgenai-int4": OrtGenaiAdapter,
    "ortgenai-fp32": OrtGenaiFp32Adapter,
    "openvino-int4-sym": OpenVinoAdapter,
    "openvino-int4-asym": OpenVinoAsymAdapter,
    "vllm-bf16": VllmAdapter,
    "transformers-fp32": TransformersAdapter,
}


def _rss_bytes(field: str = "VmRSS") -> int | None:
    """Current resident set (Linux /proc/self/status; ``RssAnon``: private memory, ``RssFile``:
    file pages such as a memory-mapped weights file), None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _dist_name(*names: str) -> str | None:
    from importlib import metadata

    for n in names:
        try:
            return f"{n} {metadata.version(n)}"
        except metadata.PackageNotFoundError:
            continue
    return None


class ForeignLoad:
    """CPU time other processes used while this one measured, in cores (0 = the machine was ours).

    System-wide busy time from /proc/stat minus this process's own CPU time, over the wall time.
    On these shared 2-core machines a measurement taken while another job held a core is not a
    measurement of the engine: the orchestrator leaves such runs out of the medians.
    """

    def __init__(self):
        self.t, self.busy, self.own = time.perf_counter(), self._busy_s(), self._own_s()

    @staticmethod
    def _busy_s() -> float | None:
        try:
            f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
        total = sum(f[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        return (total - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        """CPU seconds of this process and every process it started (vLLM runs its engine core and
        its worker as child processes: their CPU is the engine's, not foreign load)."""
        return process_tree_cpu_s(os.getpid())

    def cores(self) -> float | None:
        busy = self._busy_s()
        if busy is None or self.busy is None:
            return None
        wall = time.perf_counter() - self.t
        return max(0.0, (busy - self.busy) - (self._own_s() - self.own)) / wall


def worker_main(engine: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    n_out = int(spec["num_output_tokens"])
    t_worker = time.perf_counter()
    a = ADAPTERS[engine](spec)
    t = time.perf_counter()
    a.load()
    load_s = time.perf_counter() - t
    # Warm-up: every prompt length once (prefill shapes), and one batch of 8 x 128 (2 tokens each).
    warm = spec["warmup"]
    for n in PROMPT_LENGTHS:
        a.run_one(warm[:n], 2)
    a.run_many(spec["warmup_concurrent"], 2)
    res = {"engine": engine, "load_s": load_s, "ttft_s": {}, "tpot_s": {}, "first_output_ids": {}}
    probe = ForeignLoad()
    for n in PROMPT_LENGTHS:
        ids = spec["prompts"][str(n)]
        assert len(ids) == n, (len(ids), n)
        ttft, tpot, out = a.run_one(ids, n_out)
        if len(out) != n_out:
            raise RuntimeError(f"{engine}: asked for {n_out} tokens at prompt {n}, got {len(out)}")
        res["ttft_s"][str(n)], res["tpot_s"][str(n)] = ttft, tpot
        res["first_output_ids"][str(n)] = out[:8]
    wall, outs = a.run_many(spec["concurrent"], n_out)
    if any(len(o) != n_out for o in outs):
        raise RuntimeError(f"{engine}: concurrent run returned lengths {[len(o) for o in outs]}, expected {n_out}")
    res["concurrent"] = {"num_requests": len(outs), "wall_s": wall, "output_tokens_per_s": sum(map(len, outs)) / wall}
    res["foreign_load_cores"] = probe.cores()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM: this process image's own high-water mark. ru_maxrss would also count the parent's
    # resident set at fork time (Linux keeps the larger of the two across exec).
    res["peak_rss_bytes"] = _rss_bytes("VmHWM") or ru.ru_maxrss * 1024
    # CPU time / (wall x threads): well below 1 means the worker did not get its cores (other load
    # on the shared machine); spin-waiting thread pools (llama.cpp, ORT) keep it high regardless.
    res["cpu_share"] = ForeignLoad._own_s() / (time.perf_counter() - t_worker) / a.threads
    res["versions"] = a.versions()
    res["extra"] = a.extra()
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0
