"""Golden outputs: greedy continuations of the fp32 torch reference, recorded once per content.

Every build records what ``trtpipe validate`` later compares the engines with (``golden.json``:
per prompt the prompt ids, the greedy output ids and the top-5 logits at each generated
position). Recording is the slowest part of a build on a CPU (one reference decode step per
token: 4 prompts x 128 tokens took 455 s on a loaded 2-core host), and its result depends only on
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
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtpipe.pipeline.model_config_override import with_sliding_window
from trtpipe.runtime.kv.planning import blocks_for_tokens


@dataclass(frozen=True)
class GoldenPrompt:
    """One golden prompt: ``text``, chat-templated (one user turn) when ``chat`` and the model
    has a template, else fed as raw text (a completion)."""

    text: str
    chat: bool = True


# The golden set: the README's and docs' example prompts (chat-templated where they are) and
# prompts of the kinds the validate scenarios serve (questions, code, lists, summaries, raw
# completions). validate compares the artifact with the fp32 reference over all of them.
GOLDEN_PROMPTS = (
    GoldenPrompt("What is the capital of France?"),  # README: generate, chat, the openai snippet
    GoldenPrompt("Why is the sky blue?"),  # README: generate from stdin
    GoldenPrompt("Tell me a story."),  # README: LLM.stream
    GoldenPrompt("Once upon a time", chat=False),  # README: completions stream
    GoldenPrompt("The capital of France is", chat=False),  # tests, /tokenize example
    GoldenPrompt("Write a Python function that returns the n-th Fibonacci number."),
    GoldenPrompt("Explain in two sentences why the sky is blue."),
    GoldenPrompt("List three uses of a paperclip."),
    GoldenPrompt("def fibonacci(n):", chat=False),
    GoldenPrompt("Once upon a time, in a land far away,", chat=False),
    GoldenPrompt("Translate 'good morning' into Spanish."),
    GoldenPrompt("What is 12 times 7?"),
    GoldenPrompt("Summarize the plot of Romeo and Juliet in one paragraph."),
    GoldenPrompt("Give me three tips for writing clean code."),
    GoldenPrompt("Write a haiku about the ocean."),
    GoldenPrompt("How do I reverse a list in Python?"),
    GoldenPrompt("The first lighthouses were not towers at all but", chat=False),
    GoldenPrompt("What are the symptoms of the common cold?"),
)
GOLDEN_CACHE_DIR = Path(".cache") / "golden"  # under the artifacts root
REFERENCE_DESCRIPTION = "torch fp32 (dequantized weights)"
PROGRESS_EVERY_S = 10.0
# the code the recording runs: a change to any of these files is a new key
_REFERENCE_SOURCES = (
    "pipeline/model.py",
    "pipeline/golden.py",
    "pipeline/gguf_loader.py",
    "pipeline/hf_loader.py",
    "pipeline/weights.py",
    "plugins/ops/torch_ops.py",
    "plugins/ops/paged_attention/reference.py",
    "plugins/ops/int4_gemm/pack.py",
    "plugins/core/rope.py",
    "plugins/ops/int4_gemm/gguf_blocks.py",
    "pipeline/model_config_override.py",
    "pipeline/tokenizer_gguf/fields.py",
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
    root = Path(__file__).resolve().parents[1]
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
    """The key of ``loaded`` (a :class:`~trtpipe.pipeline.weights.LoadedModel`) with the recipe's
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


def golden_for_build(
    loaded,
    sliding_window: int | None,
    num_tokens: int,
    make_ref: Callable[[], Any],
    artifact_root: Path,
    *,
    log: Callable[[str], None] = print,
) -> tuple[dict, bool]:
    """The golden outputs a build writes: cached under ``artifact_root`` or recorded with the fp32
    reference ``make_ref()`` (built only when recording). Returns (golden, reused)."""
    key = golden_key(loaded, sliding_window)

    def record(n: int) -> dict:
        log(
            f"recording golden outputs from the torch reference ({len(key.prompts)} prompts x up to {n} tokens; "
            f"cached for later builds of this model) ..."
        )
        return record_golden(
            make_ref(), loaded.tokenizer_json, loaded.config.chat_template, n, prompts=key.prompts, log=log
        )

    return cached_golden(artifact_root, key, num_tokens, record, log=log)


@contextmanager
def torch_threads(n: int = 1):
    """Run the block with ``n`` torch intra-op threads (restored after). The reference runs
    single-threaded: measured on the shared 2-core host (load ~15), 6 reference tokens took 102.6 s
    with 2 threads and 12.3 s with 1 (OpenMP threads spin-waiting on a descheduled partner), and
    one thread count everywhere keeps the float reduction order, so the cached recording is the
    same on every machine of one CPU family."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_greedy(
    ref,
    prompt_ids: list[int],
    num_tokens: int,
    block_size: int = 16,
    eos: set[int] | frozenset = frozenset(),
    on_token: Callable[[int], None] | None = None,
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy continuation with the torch reference through its paged path (prefill once, then
    one decode step per token). ``on_token(i)`` is called after generated token i (0-based).
    Returns (token ids, logits per generated position [V] float32)."""
    import torch

    c = ref.config
    total = len(prompt_ids) + num_tokens
    nb = blocks_for_tokens(total, block_size) + 1  # + the null block 0
    caches = []
    for i in range(c.num_layers):
        shape = (c.layer_num_kv_heads[i], nb, block_size, c.head_dim)  # head-major pool
        caches += [torch.zeros(shape), torch.zeros(shape)]
    table = np.arange(1, nb, dtype=np.int64)[None, :]
    slot = lambda p: table[0, p // block_size] * block_size + p % block_size  # noqa: E731
    n = len(prompt_ids)
    pos = np.arange(n)
    logits, caches = ref.run_paged(prompt_ids, pos, slot(pos), table, [n], [0, n], [n - 1], caches)
    out, all_logits = [], []
    for step in range(num_tokens):
        row = logits[0].numpy()
        all_logits.append(row)
        nxt = int(np.argmax(row))
        out.append(nxt)
        if on_token is not None:
            on_token(step)
        if nxt in eos or step == num_tokens - 1:
            break
        p = n + step
        logits, caches = ref.run_paged([nxt], [p], [slot(p)], table, [p + 1], [0, 1], [0], caches)
    return out, all_logits


def record_golden(
    ref_fp32,
    tokenizer_json: str,
    chat_template: str | None,
    num_tokens: int,
    *,
    prompts: Sequence[GoldenPrompt] = GOLDEN_PROMPTS,
    log: Callable[[str], None] = lambda s: None,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> dict:
    """Greedy continuations, top-5 logits and the top-2 margin (logits, top-1 minus top-2) at
    each generated position of ``prompts`` (chat-templated where the prompt says so and the model
    has a template) from the fp32 reference. Logs each prompt and, at most every
    ``progress_every_s`` seconds, the token count, rate and time left of the running prompt."""
    from tokenizers import Tokenizer

    from trtpipe.runtime.artifact.chat_template import default_chat_messages, render_chat

    tok = Tokenizer.from_str(tokenizer_json)
    eos = set(ref_fp32.config.eos_token_ids)
    out = []
    for i, gp in enumerate(prompts):
        chat = gp.chat and bool(chat_template)
        text = render_chat(chat_template, default_chat_messages(gp.text)) if chat else gp.text
        ids = tok.encode(text, add_special_tokens=True).ids
        log(f"golden prompt {i + 1}/{len(prompts)} ({len(ids)} prompt tokens, up to {num_tokens} new) ...")
        t0 = last = time.perf_counter()

        def progress(step: int, i: int = i, t0: float = t0) -> None:
            nonlocal last
            now = time.perf_counter()
            if now - last >= progress_every_s and step + 1 < num_tokens:
                last = now
                rate = (step + 1) / (now - t0)
                log(
                    f"  golden prompt {i + 1}/{len(prompts)}: {step + 1}/{num_tokens} tokens, {rate:.1f} tokens/s, "
                    f"at most {(num_tokens - step - 1) / rate:.0f} s left for this prompt"
                )

        with torch_threads(1):
            gen, logits = reference_greedy(ref_fp32, ids, num_tokens, eos=eos, on_token=progress)
        top = []
        for row in logits:
            k = np.argsort(-row)[:5]
            top.append([[int(j), float(row[j])] for j in k])
        margins = [round(t[0][1] - t[1][1], 6) for t in top]
        out.append(
            {"prompt": gp.text, "chat": chat, "prompt_ids": ids, "output_ids": gen, "top5": top, "top2_margin": margins}
        )
        log(f"  golden prompt {i + 1}/{len(prompts)}: {len(gen)} tokens in {time.perf_counter() - t0:.1f} s")
    return {"reference": REFERENCE_DESCRIPTION, "num_tokens": num_tokens, "sequences": out}


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
    "GOLDEN_PROMPTS",
    "GoldenKey",
    "GoldenPrompt",
    "cache_path",
    "cached_golden",
    "golden_for_build",
    "golden_key",
    "model_content_sha256",
    "record_golden",
    "reference_code_sha256",
    "reference_greedy",
    "torch_threads",
    "truncate_golden",
]
