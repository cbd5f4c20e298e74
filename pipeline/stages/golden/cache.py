"""The golden cache: a recording is keyed by what it depends on and reused across builds.

Recording is the slowest part of a build on a CPU (one reference decode step per token: ~85 s
for the 18 golden prompts x 64 tokens on a quiet 2-core Zen 4), and its result depends only on
the model, not on the target, so it is cached by content::

    key = sha256(model file bytes, reference precision, prompts, layer sliding windows,
                 sources of the reference code)                      (num_tokens is NOT in it)
    <artifacts>/.cache/golden/<key>.json   {"key": {...}, "golden": {... num_tokens: N ...}}

A recording of N tokens serves every request for n <= N tokens exactly: the reference computes
token i from the prompt and tokens < i only (the KV pool's size does not enter the attention),
so the first n tokens and their logits of an N-token recording are bit for bit those of an
n-token recording. A request for more than N tokens records from scratch and replaces the
entry. Entries are written atomically; an unreadable or mismatching entry is recorded again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtpipe.pipeline.model.overrides import with_sliding_window
from trtpipe.pipeline.stages.golden.prompts import GOLDEN_PROMPTS, GoldenPrompt

GOLDEN_CACHE_DIR = Path(".cache") / "golden"  # under the artifacts root


# the code the recording runs: a change to any of these files is a new key
_REFERENCE_SOURCES = (
    "pipeline/model/reference/__init__.py",
    "pipeline/model/reference/model.py",
    "pipeline/model/reference/layers.py",
    "pipeline/model/reference/linears.py",
    "pipeline/model/families.py",
    "pipeline/model/quantize.py",
    "pipeline/stages/golden/prompts.py",
    "pipeline/stages/golden/record.py",
    "pipeline/model/gguf.py",
    "pipeline/model/hf.py",
    "pipeline/model/weights.py",
    "plugins/ops/torch_ops.py",
    "plugins/ops/paged_attention/reference.py",
    "plugins/ops/int4_gemm/pack.py",
    "plugins/core/rope.py",
    "plugins/ops/int4_gemm/gguf_blocks.py",
    "pipeline/model/overrides.py",
    "pipeline/model/tokenizer/fields.py",
    "plugins/ops/int4_gemm/layout.py",
    "plugins/ops/int4_gemm/reference.py",
    # the torch ops' eager bodies and the descriptions that bind their arguments (plugins/ by op)
    "plugins/ops/paged_attention/torch_op.py",
    "plugins/ops/int4_gemm/torch_op.py",
    "plugins/ops/spec.py",
    "plugins/ops/paged_attention/spec.py",
    "plugins/ops/int4_gemm/spec.py",
)


@dataclass(frozen=True)
class GoldenKey:
    """What a golden recording depends on (num_tokens excluded: see the module docstring)."""

    model_sha256: str  # content of the model file (or of every file of a folder, sorted by name)
    model_config_sha256: str  # the loaded ModelConfig (layers, heads, rope, eos...) as JSON
    precision: str  # the reference's weight precision ("fp32")
    prompts: tuple[GoldenPrompt, ...]
    layer_sliding_window: tuple[int, ...]  # after the recipe's sliding_window override
    reference_code_sha256: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def _sha256_files(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def model_content_sha256(model_path: Path) -> str:
    """sha256 over the model file's bytes (a folder: every file, sorted by name). ~0.1 s for 100 MB."""
    p = Path(model_path)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file())
    return _sha256_files(files)


def reference_code_sha256() -> str:
    """sha256 of the source files the reference recording runs (:data:`_REFERENCE_SOURCES`)."""
    root = Path(__file__).resolve().parents[3]  # the folder of pipeline/, runtime/ and plugins/
    missing = [s for s in _REFERENCE_SOURCES if not (root / s).is_file()]
    if missing:  # a renamed file would silently drop out of the key
        raise FileNotFoundError(f"golden key sources missing: {missing}. Fix: update _REFERENCE_SOURCES in {__file__}")
    return _sha256_files([root / s for s in _REFERENCE_SOURCES])


def golden_key(
    loaded,
    sliding_window: int | None = None,
    *,
    precision: str = "fp32",
    prompts: Sequence[GoldenPrompt] = GOLDEN_PROMPTS,
) -> GoldenKey:
    """The key of ``loaded`` (a :class:`~trtpipe.pipeline.model.weights.LoadedModel`) with the recipe's
    ``sliding_window`` override (None: the model's own windows)."""
    c = loaded.config
    windows = with_sliding_window(c, sliding_window).layer_sliding_window
    config_sha = hashlib.sha256(json.dumps(c.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    return GoldenKey(
        model_content_sha256(loaded.source_path),
        config_sha,
        precision,
        tuple(prompts),
        tuple(int(w) for w in windows),
        reference_code_sha256(),
    )


def truncate_golden(golden: dict, num_tokens: int) -> dict:
    """The first ``num_tokens`` generated tokens (and their top-5 logits) of each sequence of a
    recording with at least that many: exactly what a ``num_tokens`` recording holds."""
    if golden["num_tokens"] < num_tokens:
        raise ValueError(f"a {golden['num_tokens']}-token recording cannot serve {num_tokens} tokens")
    seqs = [
        {
            **s,
            "output_ids": s["output_ids"][:num_tokens],
            "top5": s["top5"][:num_tokens],
            **({"top2_margin": s["top2_margin"][:num_tokens]} if "top2_margin" in s else {}),
        }
        for s in golden["sequences"]
    ]
    return {**golden, "num_tokens": num_tokens, "sequences": seqs}


def cache_path(artifact_root: Path, key: GoldenKey) -> Path:
    return Path(artifact_root) / GOLDEN_CACHE_DIR / f"{key.digest()}.json"


def _read_entry(path: Path, key: GoldenKey, log: Callable[[str], None]) -> dict | None:
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry["key"] != json.loads(json.dumps(asdict(key))):
            raise ValueError("its key differs from its file name")
        golden = entry["golden"]
        if not isinstance(golden.get("sequences"), list) or not isinstance(golden.get("num_tokens"), int):
            raise ValueError("no sequences / num_tokens")
        return golden
    except (OSError, ValueError, KeyError, TypeError) as e:
        log(f"golden cache entry {path} is not usable ({e}); recording again")
        return None


def cached_golden(
    artifact_root: Path,
    key: GoldenKey,
    num_tokens: int,
    record: Callable[[int], dict],
    *,
    log: Callable[[str], None] = print,
) -> tuple[dict, bool]:
    """The golden outputs for ``key`` with ``num_tokens`` tokens: from the cache under
    ``artifact_root`` when an entry with at least that many tokens exists, else ``record(num_tokens)``
    (written to the cache atomically). Returns (golden, reused)."""
    from trtpipe.runtime.artifact.manifest import atomic_write_text

    path = cache_path(artifact_root, key)
    golden = _read_entry(path, key, log)
    if golden is not None and golden["num_tokens"] >= num_tokens:
        log(
            f"golden outputs reused from {path} (same model, reference precision {key.precision}, prompts and "
            f"reference code; {golden['num_tokens']} tokens recorded, {num_tokens} needed)"
        )
        return truncate_golden(golden, num_tokens), True
    if golden is not None:
        log(f"golden cache {path} holds {golden['num_tokens']} tokens, {num_tokens} needed: recording again")
    t0 = time.perf_counter()
    golden = record(num_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"key": asdict(key), "recorded_s": round(time.perf_counter() - t0, 1), "golden": golden}
    atomic_write_text(path, json.dumps(entry))
    log(f"golden outputs recorded in {entry['recorded_s']} s, cached at {path}")
    return golden, False


__all__ = [
    "GOLDEN_CACHE_DIR",
    "GoldenKey",
    "cache_path",
    "cached_golden",
    "golden_key",
    "model_content_sha256",
    "reference_code_sha256",
    "truncate_golden",
]
