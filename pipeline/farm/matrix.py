"""The farm's matrix report: recipe x target -> what happened, as markdown and JSON, and the
exit code a CI job gates on.

Exit code of a farm run (:func:`exit_code`): 0 every requested cell is published or already in
the store; 1 any cell failed (build, validate, no node, memory, node lost, cancelled, error);
3 none failed but some stopped at their build spec (GPU targets on nodes without TensorRT: the
same code as ``trtpipe build``'s "finish on the target"). A planning recipe (no model source)
is reported and does not change the code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trtpipe.pipeline.farm.tasks import STATUS_FAILED, CellResult
from trtpipe.pipeline.targets import TARGET_FAMILIES

EXIT_OK, EXIT_FAILED, EXIT_SPEC_WRITTEN = 0, 1, 3
MATRIX_VERSION = 1

# status -> the word in the markdown cell
_WORDS = {
    "published": "built, published",
    "skipped": "in store (skipped)",
    "planning": "not buildable: planning recipe",
    "needs_target": "not buildable here: build spec only",
    "validate_failed": "validate FAIL",
    "build_failed": "build FAILED",
    "refused_memory": "refused: node memory",
    "no_node": "no node",
    "node_lost": "node lost",
    "cancelled": "cancelled",
    "error": "error",
}


@dataclass(frozen=True)
class MatrixPaths:
    markdown: Path
    json: Path


def exit_code(results: Sequence[CellResult]) -> int:
    if any(STATUS_FAILED[r.status] for r in results):
        return EXIT_FAILED
    if any(r.status == "needs_target" for r in results):
        return EXIT_SPEC_WRITTEN
    return EXIT_OK


def _cell_word(r: CellResult) -> str:
    word = _WORDS[r.status]
    if r.status in ("published", "skipped") and r.validate:
        word += f", validate {r.validate}"
    return word


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def to_json(results: Sequence[CellResult], *, store_url: str, address: str | None, wall_s: float) -> dict:
    return {
        "matrix_version": MATRIX_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "store": store_url,
        "ray_address": address or "local",
        "wall_s": round(wall_s, 2),
        "exit_code": exit_code(results),
        "cells": [{**asdict(r), "failed": r.failed} for r in results],
    }


def to_markdown(results: Sequence[CellResult], *, store_url: str, wall_s: float) -> str:
    recipes = list(dict.fromkeys(r.recipe for r in results))
    order = {t: i for i, t in enumerate(TARGET_FAMILIES)}
    targets = sorted({r.target for r in results}, key=lambda t: (order.get(t, len(order)), t))
    by = {(r.recipe, r.target): r for r in results}
    code = exit_code(results)
    verdict = {EXIT_OK: "PASS", EXIT_FAILED: "FAIL", EXIT_SPEC_WRITTEN: "INCOMPLETE (finish GPU builds on the targets)"}
    lines = [
        f"# trtpipe farm matrix: {verdict[code]} (exit {code})",
        "",
        f"store `{store_url}`, {len(results)} cells, {wall_s:.1f} s wall",
        "",
        "| recipe | " + " | ".join(targets) + " |",
        "|---|" + "---|" * len(targets),
    ]
    for rc in recipes:
        cells = [_cell_word(by[(rc, t)]) if (rc, t) in by else "" for t in targets]
        lines.append(f"| {rc} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| recipe | target | status | node | build s | validate s | publish s | build hash | manifest sha256 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.recipe} | {r.target} | {r.status} | {r.node or '-'} | {_fmt_s(r.build_s)} | "
            f"{_fmt_s(r.validate_s)} | {_fmt_s(r.publish_s)} | {r.build_hash[:12] or '-'} | "
            f"{(r.manifest_sha256 or '-')[:12]} |"
        )
    lines += ["", "## Details", ""]
    for r in results:
        lines.append(f"- **{r.recipe} x {r.target}: {r.status}**: " + " ".join((r.detail or "").split()))
        lines += [f"  - failing: {b}" for b in r.failing_budgets]
        if r.log_path:
            lines.append(f"  - log on the node: `{r.log_path}`")
    return "\n".join(lines) + "\n"


def write_matrix(
    results: Sequence[CellResult], out_dir: str | Path, *, store_url: str, address: str | None, wall_s: float
) -> MatrixPaths:
    """Write ``matrix.md`` and ``matrix.json`` into ``out_dir`` (created)."""
    from trtpipe.runtime.artifact.manifest import atomic_write_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = MatrixPaths(out / "matrix.md", out / "matrix.json")
    atomic_write_text(paths.markdown, to_markdown(results, store_url=store_url, wall_s=wall_s))
    atomic_write_text(
        paths.json, json.dumps(to_json(results, store_url=store_url, address=address, wall_s=wall_s), indent=1)
    )
    return paths
