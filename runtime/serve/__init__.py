"""``trtpipe serve``: an OpenAI-compatible HTTP server over the runtime (extra ``serve``:
FastAPI, uvicorn, prometheus-client). Runtime side: no torch, no pipeline imports.

Modules: :mod:`.protocol` (request validation, error bodies), :mod:`.engine_loop` (the engine
thread that owns the ``LLM``), :mod:`.responses` (OpenAI bodies and SSE chunks),
:mod:`.prometheus` (metrics), :mod:`.app` (the FastAPI app), :mod:`.server` (uvicorn, signals),
:mod:`.defaults` (the limits' defaults the CLI shares). The client side of validate over HTTP
is :mod:`trtpipe.runtime.measure.http_client`.
"""
