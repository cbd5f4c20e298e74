"""Setup of bench/serve.py: each tool in its own venv, each step timed and recorded.

llama-cpp-python[server] goes into ``.venv-bench`` (the venv of bench/peers.py, so the 10-20 minute
llama.cpp build is shared), aiperf into ``.venv-bench-aiperf`` (Python >= 3.11 and ~150 packages of
its own). Groups and pins: bench/requirements-serve.txt. Each step's result is kept in its venv's
``setup-<group>.json``; a failed step is retried only by ``--setup``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import peers

REPO = peers.REPO
BENCH_VENV = peers.BENCH_VENV  # llama-cpp-python[server], shared with bench/peers.py
AIPERF_VENV = REPO / ".venv-bench-aiperf"
REQUIREMENTS = REPO / "bench" / "requirements-serve.txt"
GROUP_VENVS = {"llama.cpp-server": BENCH_VENV, "aiperf": AIPERF_VENV}


def _state_file(group: str) -> Path:
    return GROUP_VENVS[group] / f"setup-{group}.json"


def load_setup_state() -> dict[str, dict]:
    state = {}
    for group in GROUP_VENVS:
        try:
            state[group] = json.loads(_state_file(group).read_text())
        except (OSError, ValueError):
            pass
    return state


def setup(groups: list[str], retry_failed: bool, log=print) -> dict[str, dict]:
    """Create each of ``groups``' venv and ``pip install`` its requirements, timing each step.

    A step recorded as ok is checked again by pip (seconds); one recorded as failed is retried only
    when ``retry_failed`` (``--setup``), so a plain run does not rebuild llama.cpp for 15 minutes
    just to fail again.
    """
    state = load_setup_state()
    base = getattr(sys, "_base_executable", sys.executable)
    requirements = peers.read_requirement_groups(REQUIREMENTS)
    for group in groups:
        venv, reqs = GROUP_VENVS[group], requirements[group]
        prev = state.get(group)
        if prev is not None and not prev.get("ok") and not retry_failed:
            continue
        t0 = time.monotonic()
        if not (venv / "bin" / "python").exists():
            log(f"setup: creating {venv.name}/ ...")
            subprocess.run([base, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ)
        if group == "llama.cpp-server":  # builds from source; native = this CPU's AVX2/AVX-512
            env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=ON")
            env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        log(
            f"setup: pip install into {venv.name}/: {' '.join(reqs)} (llama-cpp-python builds from source: "
            "10-20 min on 2 quiet cores, 60 min on a busy one) ..."
            if group == "llama.cpp-server"
            else f"setup: pip install into {venv.name}/: {' '.join(reqs)} ..."
        )
        p = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *reqs],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-4:])[-600:]
        state[group] = {
            "ok": p.returncode == 0,
            "seconds": round(time.monotonic() - t0, 1),
            "packages": reqs,
            "venv": venv.name,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "error": "" if p.returncode == 0 else f"pip exit {p.returncode}: {tail}",
            "note": "" if "Successfully installed" in p.stdout else "already installed",
        }
        _state_file(group).write_text(json.dumps(state[group], indent=2))
        log(f"setup:   [{group}] {'ok' if state[group]['ok'] else 'FAILED'} in {state[group]['seconds']} s")
    return state


def unavailable_reason(group: str, state: dict) -> str | None:
    s = state.get(group)
    if s is None or not (GROUP_VENVS[group] / "bin" / "python").exists():
        return f"setup step [{group}] has not run (run `python bench/serve.py --setup`)"
    if not s.get("ok"):
        return f"setup step [{group}] failed: {s.get('error')} (retry: `python bench/serve.py --setup`)"
    return None


def tokenizer_dir(artifact: Path) -> Path:
    """A local tokenizer folder for aiperf (no hub here): the artifact's tokenizer.json plus a minimal
    tokenizer_config.json, so ``AutoTokenizer.from_pretrained(folder)`` loads it offline."""
    out = AIPERF_VENV / "tokenizer-smollm2"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|im_end|>",
                "model_max_length": 8192,
                "clean_up_tokenization_spaces": False,
            },
            indent=1,
        )
    )
    return out
