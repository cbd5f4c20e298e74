"""bench/peers.py, the workload: a fixed English text whose token-id windows are every engine's
prompts (the same ids for all), and the spec file each worker reads."""

from __future__ import annotations

from pathlib import Path

from peers_setup import MODELS_DIR, gguf_path

PROMPT_LENGTHS = (16, 128, 512)
NUM_OUTPUT_TOKENS = 64
NUM_CONCURRENT = 8
CONCURRENT_PROMPT_TOKENS = 128
RESULT_MARK = "@@peers-result@@ "

# A fixed English text; prompts are windows of its token ids (the same ids for every engine).
TEXT = """\
The first lighthouses were not towers at all but fires lit on hilltops, tended by people who knew
that a ship coming home at night had nothing else to steer by. Over the centuries the fires moved
onto stone towers, the towers grew taller, and the open flames were replaced by oil lamps, then by
lenses that gathered the light of a single wick and threw it twenty miles out to sea. Each change
was driven by the same question: how far away can a sailor see the coast, and how quickly can he
tell one light from another? The answer to the second half of that question turned out to be
timing. A light that flashes twice every ten seconds is a different light from one that flashes
once every five, and a captain with a printed list of lights and a watch can tell where he is
without ever seeing land.

Keeping a lighthouse was hard, lonely work. The keeper trimmed wicks, polished brass and glass,
wound the clockwork that turned the lens, and wrote the weather into a log every few hours. On
rock stations far from shore, relief boats could be delayed for weeks by storms, and keepers
learned to ration food, fuel and patience. Many stations kept three keepers so that one could
sleep while another watched and the third worked. The records they left are some of the most
detailed weather diaries of the nineteenth century, and historians still use them to study storms
that no instrument on land recorded.

Engineering the towers was its own discipline. A tower on a wave-swept rock has to survive water
hitting it with the force of a train, again and again, for a hundred years. Builders learned to
dovetail the granite blocks of each course into one another and into the courses above and below,
so that the whole tower behaved like a single stone. They tapered the base so that waves would
run up and around it instead of striking a flat face. Some of those towers, built with hand tools
and sailing ships, are still standing and still lit, although the light is now an electric lamp
switched on by a sensor and nobody lives at the station any more.

Automation changed the work completely. Electric lamps replaced oil, lamp changers swapped a
failed bulb for a new one without human help, and radio links let a single engineer on shore watch
dozens of stations at once. Satellite navigation then changed the purpose of the lights
themselves: a ship today knows its position to within a few metres from signals sent by
satellites, and the lighthouse has become a backup, a landmark and a reminder of the coast rather
than the main way to find it. Yet authorities keep many of them lit, because electronics fail,
because small boats still rely on them, and because a light on a headland is a simple system that
works when more complicated ones do not.

There is a lesson in that for anyone who builds machines. The best designs are often the ones
whose behaviour can be checked by eye: a light either flashes in its pattern or it does not. When
something more ambitious is added on top, the simple thing underneath keeps its value as a
reference, a fallback and a way to tell whether the clever new system is telling the truth.
"""


def prompt_token_ids(artifact: Path) -> list[int]:
    """Token ids of :data:`TEXT` with the artifact's tokenizer (no BOS, no template)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    need = max(PROMPT_LENGTHS) + 32 + NUM_CONCURRENT * 16
    if len(ids) < need:
        raise SystemExit(f"bench text has {len(ids)} tokens; need {need}")
    return ids


def make_spec(artifact: Path, threads: int, artifact_fast: Path | None = None) -> dict:
    ids = prompt_token_ids(artifact)
    # Warm-up ids start 32 tokens in, so they are not a prefix of the measured prompts.
    return {
        "threads": threads,
        "artifact": str(artifact),
        "artifact_fast": None if artifact_fast is None else str(artifact_fast),
        "gguf": str(gguf_path()),
        "models_dir": str(MODELS_DIR),
        "num_output_tokens": NUM_OUTPUT_TOKENS,
        "prompts": {str(n): ids[:n] for n in PROMPT_LENGTHS},
        "warmup": ids[32 : 32 + max(PROMPT_LENGTHS)],
        # 8 different (overlapping) 128-token windows: no engine can reuse one as another's prefix.
        "concurrent": [ids[16 * i : 16 * i + CONCURRENT_PROMPT_TOKENS] for i in range(NUM_CONCURRENT)],
        # Same shapes as the measured batch (8 x 128), other windows of the text.
        "warmup_concurrent": [
            ids[200 + 16 * i : 200 + 16 * i + CONCURRENT_PROMPT_TOKENS] for i in range(NUM_CONCURRENT)
        ],
    }
