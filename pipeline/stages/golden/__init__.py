"""Golden outputs: the fp32 reference's greedy continuations of the golden prompts, recorded once
per model content (:mod:`.cache`), that ``trtpipe validate`` holds every engine to (docs/fidelity.md).

    prompts.py  the golden prompts           record.py  the reference's greedy run, top-5, margins
    cache.py    content key, reuse, truncation   stage.py   the build stage: golden.json
"""

from trtpipe.pipeline.stages.golden.cache import (
    GOLDEN_CACHE_DIR,
    GoldenKey,
    cache_path,
    cached_golden,
    golden_key,
    model_content_sha256,
    reference_code_sha256,
    truncate_golden,
)
from trtpipe.pipeline.stages.golden.prompts import (
    BASE_GOLDEN_PROMPTS,
    GOLDEN_PROMPTS,
    GOLDEN_SETS,
    GoldenPrompt,
    GoldenSet,
)
from trtpipe.pipeline.stages.golden.record import REFERENCE_DESCRIPTION, record_golden, reference_greedy, torch_threads
from trtpipe.pipeline.stages.golden.stage import GOLDEN_FILE, golden_for_build, write_golden

__all__ = [
    "BASE_GOLDEN_PROMPTS",
    "GOLDEN_SETS",
    "GoldenSet",
    "GOLDEN_CACHE_DIR",
    "GOLDEN_FILE",
    "GOLDEN_PROMPTS",
    "REFERENCE_DESCRIPTION",
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
    "write_golden",
]
