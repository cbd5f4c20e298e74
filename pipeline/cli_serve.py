"""``trtpipe serve``: the OpenAI-compatible HTTP server (registered in :mod:`trtpipe.pipeline.cli`).

The server itself lives in :mod:`trtpipe.runtime.serve` (no torch); this is only the command line.
"""

from __future__ import annotations

import sys

import click


def _need_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        click.echo(f"error: `trtpipe serve` needs the serve extra ({e.name} is not installed). "
                   "Fix: pip install 'trtpipe[serve]'", err=True)
        sys.exit(2)


@click.command("serve")
@click.argument("recipe_or_artifact")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--max-queued-requests", default=64, show_default=True, type=click.IntRange(min=1),
              help="Most requests waiting for admission; past it new ones get 503 with Retry-After.")
@click.option("--request-timeout-s", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Cancel a request still running this long after arrival (finish_reason \"timeout\"). "
                   "Default: no limit.")
@click.option("--api-key", default=None, envvar="TRTPIPE_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1 and /tokenize (401 otherwise).")
@click.option("--shutdown-grace-s", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="On SIGTERM/SIGINT: how long running requests may finish before they are cancelled.")
@click.option("--artifacts", "artifact_root", default="artifacts", show_default=True,
              help="Root folder for artifacts (<root>/<recipe>/<target>).")
@click.option("--threads", default=None, type=int, help="ONNX Runtime intra-op threads.")
def serve_cmd(recipe_or_artifact: str, host: str, port: int, max_queued_requests: int,
              request_timeout_s: float | None, api_key: str | None, shutdown_grace_s: float,
              artifact_root: str, threads: int | None) -> None:
    """Serve a built artifact over an OpenAI-compatible HTTP API (no torch needed).

    \b
    Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: Server-Sent Events),
    GET /v1/models, GET /health (503 while loading), GET /metrics (Prometheus, trtpipe:*),
    POST /tokenize, POST /detokenize. The model name is the recipe name.
    A client that disconnects has its request cancelled and its KV blocks freed at once.
    SIGTERM/SIGINT: stop admitting, let running requests finish (--shutdown-grace-s), exit 0.

    \b
    Example:
      trtpipe serve smollm2-135m-cpu --port 8000
      python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='-');
        print(c.chat.completions.create(model='smollm2-135m-cpu', temperature=0,
              messages=[{'role': 'user', 'content': 'What is the capital of France?'}]).choices[0].message.content)"
    """
    from trtpipe.pipeline.cli import _fail, resolve_artifact
    from trtpipe.plugins.errors import TrtpipeError

    _need_serve_extra()
    from trtpipe.runtime.manifest import load_manifest
    from trtpipe.runtime.serve.server import ServeConfig, serve

    try:
        art = resolve_artifact(recipe_or_artifact, artifact_root)
        name = load_manifest(art, verify_hashes=False).recipe_name
    except TrtpipeError as e:
        _fail(e)
    cfg = ServeConfig(artifact_dir=art, model_name=name, host=host, port=port,
                      max_queued_requests=max_queued_requests, request_timeout_s=request_timeout_s,
                      api_key=api_key, shutdown_grace_s=shutdown_grace_s, num_threads=threads)
    sys.exit(serve(cfg, echo=lambda s: click.echo(s, err=True)))
