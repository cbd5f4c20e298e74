"""Recipe hashes: :func:`recipe_hash` (every setting) and :func:`build_hash` (only the settings that
change what ``trtpipe build`` writes). Both are sha256 (hex) of canonical JSON: sorted keys, defaults
spelled out, so key order, comments and writing a default out do not change them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trtpipe.pipeline.recipe.schema import Recipe


def sha256_canonical(doc: Any) -> str:
    """sha256 (hex) of ``doc`` as canonical JSON (sorted keys, no spaces, ASCII)."""
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def build_fields(recipe: Recipe) -> dict[str, Any]:
    """The recipe's build-relevant settings as JSON (what :func:`build_hash` hashes): every
    section but ``description``, ``runtime`` (how the artifact is served: prefix caching, the
    scheduler) and ``validate`` (scenarios, budgets and the correctness gate do not change what
    ``trtpipe build`` writes; ``validate.correctness.num_tokens`` only sets the golden length, which
    :func:`~trtpipe.pipeline.validate.correctness.check_correctness` reads from golden.json itself). A
    build records it in the manifest so a mismatch can name the settings that changed. One
    validate setting is kept: ``validate.correctness.golden_set`` when not ``default`` (it chooses
    the prompts golden.json holds; left out at the default so earlier build hashes stay the same)."""
    d = recipe.model_dump(mode="json", by_alias=True)
    golden_set = ((d.get("validate") or {}).get("correctness") or {}).get("golden_set", "default")
    for section in ("description", "runtime", "validate"):
        d.pop(section, None)
    if golden_set != "default":
        d["validate"] = {"correctness": {"golden_set": golden_set}}
    return d


def build_hash(recipe: Recipe) -> str:
    """sha256 (hex) of :func:`build_fields`."""
    return sha256_canonical(build_fields(recipe))


_ABSENT = object()


def changed_fields(built: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """``'precision.decode: "int4" -> "fp32"'`` for each setting (dotted path, sorted) whose value
    differs between two :func:`build_fields` records; a setting one side lacks reads ``(none)``."""
    out: list[str] = []
    for key in sorted(set(built) | set(now)):
        a, b, path = built.get(key, _ABSENT), now.get(key, _ABSENT), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_fields(a, b, path + ".")
        elif a != b:
            out.append(f"{path}: {_shown(a)} -> {_shown(b)}")
    return out


def _shown(value: Any) -> str:
    return "(none)" if value is _ABSENT else json.dumps(value)


def recipe_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the recipe's canonical JSON (all fields, defaults included, sorted keys).

    Stable across key order, comments and spelling out a default; changes with any setting.
    Where the file lives is not part of it.
    """
    return sha256_canonical(recipe.model_dump(mode="json", by_alias=True))
