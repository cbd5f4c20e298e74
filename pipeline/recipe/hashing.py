"""Recipe hashes: :func:`recipe_hash` (every setting) and :func:`build_hash` (only the settings that
change what ``trtpipe build`` writes). Both are sha256 (hex) of canonical JSON: sorted keys, defaults
spelled out, so key order, comments and writing a default out do not change them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trtpipe.pipeline.recipe.schema import Recipe


def _sha256_canonical(doc: Any) -> str:
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def build_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the recipe's build-relevant fields: all but ``description``,
    ``kv_cache.prefix_caching`` and ``scheduler`` (runtime settings) and the ``validate`` section
    (scenarios, budgets and the correctness threshold do not change what ``trtpipe build`` writes;
    ``validate.correctness.num_tokens`` only sets the golden length, which
    :func:`~trtpipe.pipeline.validate.check_correctness` reads from golden.json itself)."""
    d = recipe.model_dump(mode="json", by_alias=True)
    d.pop("validate", None)
    d.pop("description", None)
    d["kv_cache"].pop("prefix_caching", None)  # runtime settings: the same artifact serves both
    d.pop("scheduler", None)
    return _sha256_canonical(d)


def recipe_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the recipe's canonical JSON (all fields, defaults included, sorted keys).

    Stable across key order, comments and spelling out a default; changes with any setting.
    Where the file lives is not part of it.
    """
    return _sha256_canonical(recipe.model_dump(mode="json", by_alias=True))
