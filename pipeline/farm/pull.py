"""``trtpipe pull``: fetch a published artifact onto this device and check it before use.

Steps: read the store record (``latest`` or a given build hash) -> download into a hidden
``.<dest>.pull-<pid>`` folder, checking every file against the record's sha256 -> the runtime's
own checks on that folder (:func:`trtpipe.runtime.artifact.manifest.load_manifest`: manifest files'
sha256, format version, backend version, op-schema ABI hash, platform) -> the manifest names
the requested recipe, target and build hash -> swap it in as ``dest`` (a previous artifact there
is replaced only when the new one passed every check).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtpipe.pipeline.farm.store import ArtifactStore, StoredArtifact, StoreError
from trtpipe.plugins.core.errors import TrtpipeError


@dataclass(frozen=True)
class PullResult:
    artifact_dir: Path
    stored: StoredArtifact


def _swap_in(tmp: Path, dest: Path) -> None:
    """dest -> .old, tmp -> dest, drop .old: a reader sees the old or the new artifact."""
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def pull(
    store_url: str,
    recipe: str,
    target: str,
    dest: str | Path,
    *,
    build_hash: str | None = None,
    log: Callable[[str], None] = print,
) -> PullResult:
    """Fetch ``recipe``/``target`` (``latest`` unless ``build_hash``) from the store into ``dest``.

    Raises :class:`StoreError` (no such store, nothing published, unreadable or corrupted store copy) or the
    runtime's ``ArtifactError`` (the artifact does not fit this device: the message says what
    differs). On any error ``dest`` is left as it was.
    """
    from trtpipe.runtime.artifact.manifest import load_manifest

    store = ArtifactStore(store_url)
    store.require_exists(recipe)
    stored = store.lookup(recipe, target, build_hash) if build_hash else store.latest(recipe, target)
    if stored is None:
        have = ", ".join(f"{r}/{t}" for r, t in store.published()) or "nothing"
        what = f"build {build_hash[:12]} of {recipe}/{target}" if build_hash else f"{recipe}/{target}"
        raise StoreError(
            f"store {store_url} has no published {what} (it has: {have}). Fix: publish it with "
            f"`trtpipe farm build {recipe} --store {store_url}`."
        )
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.pull-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        log(
            f"pulling {stored.url} ({len(stored.files)} files, built on {stored.node or 'unknown node'}, "
            f"published {stored.published_at})"
        )
        store.fetch(stored, tmp)
        m = load_manifest(tmp, verify_hashes=True)  # the runtime's checks, before anything uses it
        got = (m.recipe_name, m.target.get("name"), (m.build_info or {}).get("build_hash"))
        want = (recipe, target, stored.build_hash)
        if got != want:
            raise StoreError(
                f"{stored.url}: the manifest says recipe {got[0]!r}, target {got[1]!r}, build "
                f"{str(got[2])[:12]}, the store filed it as {want[0]!r}, {want[1]!r}, "
                f"{want[2][:12]}. Fix: delete that folder and publish again."
            )
        _swap_in(tmp, dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, TrtpipeError) and not isinstance(e, StoreError):
            raise type(e)(f"pulled {stored.url} but it does not fit this device: {e}") from e
        raise
    log(f"verified and installed at {dest}")
    return PullResult(dest, stored)
