"""Recording the golden outputs: greedy continuations of the fp32 torch reference through its paged path,
with the top-5 logits and the top-2 margin at every generated position."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np

from trtpipe.pipeline.stages.golden.prompts import GOLDEN_PROMPTS, GoldenPrompt
from trtpipe.runtime.kv.planning import blocks_for_tokens

REFERENCE_DESCRIPTION = "torch fp32 (dequantized weights)"


PROGRESS_EVERY_S = 10.0


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
        if gp.num_tokens is not None:
            if len(ids) < gp.num_tokens:
                raise ValueError(
                    f"golden prompt {i + 1}: {len(ids)} tokens, expected at least num_tokens={gp.num_tokens}. "
                    "Fix: give it a longer text"
                )
            ids = ids[: gp.num_tokens]
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


__all__ = ["PROGRESS_EVERY_S", "REFERENCE_DESCRIPTION", "record_golden", "reference_greedy", "torch_threads"]
