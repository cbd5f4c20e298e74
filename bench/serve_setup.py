"""Setup of bench/serve.py: each tool in its own venv, each step timed and recorded.

Own groups (bench/requirements-serve.txt, state in the venv's ``setup-<group>.json``): aiperf into
``.venv-bench-aiperf`` (Python >= 3.11 and ~150 packages of its own), llama-cpp-python[server]
into ``.venv-bench``. Shared with bench/peers.py (its setup, its ``.venv-bench/setup.json``): vLLM
CPU (``vllm``: the server and the vllm-bench client), the dequantized model it serves
(``model:hf``), and the host-ISA llama.cpp build (``llama.cpp-build``: llama-server). A failed step
is retried only by ``--setup``. Every venv lies under the bench dir (``--bench-dir``).
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
import peers_setup

REPO = peers.REPO
BENCH_VENV = peers_setup.BENCH_VENV
AIPERF_VENV = peers_setup.BENCH_DIR / ".venv-bench-aiperf"
REQUIREMENTS = REPO / "bench" / "requirements-serve.txt"
GROUP_VENVS = {"llama.cpp-server": BENCH_VENV, "aiperf": AIPERF_VENV}
# What each server and client needs: (own groups, bench/peers.py setup steps).
NEEDS = {
    "trtpipe": ((), ()),
    "trtpipe-spec": ((), ()),
    "trtpipe-fast": ((), ()),
    "vllm": ((), ("vllm", "model:hf")),
    "llama-server": ((), (peers_setup.LLAMA_BUILD_STEP,)),
    "llama-cpp-python": (("llama.cpp-server",), (peers_setup.LLAMA_BUILD_STEP,)),
    "aiperf": (("aiperf",), ()),
    "vllm-bench": ((), ("vllm",)),
}


def _state_file(group: str) -> Path:
    return GROUP_VENVS[group] / f"setup-{group}.json"


def needs(names: list[str]) -> tuple[list[str], set[str]]:
    """(own groups, bench/peers.py steps with their dependencies) the servers/clients ``names`` need."""
    groups = sorted({g for n in names for g in NEEDS[n][0]})
    steps = {s for n in names for s in NEEDS[n][1]}
    return groups, steps | _deps(steps)


def _deps(steps: set[str]) -> set[str]:
    models = peers_setup._model_steps()
    out: set[str] = set()
    todo = list(steps)
    while todo:
        for d in models.get(todo.pop(), ((),))[0]:
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


def load_setup_state() -> dict[str, dict]:
    """Own groups' records and bench/peers.py's, in one dict."""
    state = dict(peers_setup.load_setup_state())
    for group in GROUP_VENVS:
        try:
            state[group] = json.loads(_state_file(group).read_text())
        except (OSError, ValueError):
            pass
    return state


def setup(names: list[str], retry_failed: bool, amx: bool = False, log=print) -> dict[str, dict]:
    """Install what ``names`` need: bench/peers.py's steps through its setup, then the own groups."""
    groups, steps = needs(names)
    if steps:
        peers_setup.setup(retry_failed=retry_failed, only=steps, amx=amx, log=log)
    state = load_setup_state()
    requirements = peers.read_requirement_groups(REQUIREMENTS)
    for group in groups:
        prev = state.get(group)
        if prev is not None and not prev.get("ok") and not retry_failed:
            continue
        state[group] = _install(group, requirements[group], log)
    return state


def _install(group: str, reqs: list[str], log) -> dict:
    """Create the group's venv if needed and ``pip install`` its requirements; the timed record."""
    venv = GROUP_VENVS[group]
    t0 = time.monotonic()
    if not (venv / "bin" / "python").exists():
        log(f"setup: creating {venv} ...")
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    env = dict(os.environ)
    no_cache = []
    if group == "llama.cpp-server":  # the bindings only: the library is the llama.cpp-build step's
        env["CMAKE_ARGS"] = peers_setup.GROUP_ENV["llama.cpp"]["CMAKE_ARGS"]
        no_cache = ["--no-cache-dir"]
    log(f"setup: pip install into {venv.name}/: {' '.join(reqs)} ...")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *no_cache]
    p = subprocess.run(pip + reqs, env=env, capture_output=True, text=True, timeout=3600)
    tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-4:])[-600:]
    rec = {
        "ok": p.returncode == 0,
        "seconds": round(time.monotonic() - t0, 1),
        "packages": reqs,
        "venv": venv.name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "error": "" if p.returncode == 0 else f"pip exit {p.returncode}: {tail}",
        "note": "" if "Successfully installed" in p.stdout else "already installed",
    }
    _state_file(group).write_text(json.dumps(rec, indent=2))
    log(f"setup:   [{group}] {'ok' if rec['ok'] else 'FAILED'} in {rec['seconds']} s")
    return rec


def unavailable_reason(name: str, state: dict) -> str | None:
    """Why a server or client cannot run (None if it can)."""
    groups, steps = needs([name])
    for g in groups:
        if g not in state or not (GROUP_VENVS[g] / "bin" / "python").exists():
            return f"setup step [{g}] has not run (run `python bench/serve.py --setup`)"
    for s in [*groups, *sorted(steps)]:
        rec = state.get(s)
        if rec is None:
            return f"setup step [{s}] has not run (run `python bench/serve.py --setup`)"
        if not rec.get("ok"):
            return f"setup step [{s}] failed: {rec.get('error')} (retry: `python bench/serve.py --setup`)"
    return None


def tokenizer_dir(artifact: Path) -> Path:
    """A local tokenizer folder for both clients (no hub here): the artifact's tokenizer.json plus a
    minimal tokenizer_config.json, so ``AutoTokenizer.from_pretrained(folder)`` loads it offline."""
    out = peers_setup.BENCH_DIR / ".venv-bench-aiperf" / "tokenizer-smollm2"
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
