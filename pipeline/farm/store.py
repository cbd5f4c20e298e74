"""The artifact store: built artifacts, content-addressed by build hash, on any fsspec filesystem.

Layout (a local folder, ``memory://``, or any fsspec URL such as ``s3://bucket/trtpipe``)::

    <store>/<recipe>/<target>/<build_hash>/    manifest.json, graphs or plans, tokenizer.json,
                                               golden.json, validate/ (reports), ...
    <store>/<recipe>/<target>/<build_hash>/published.json   the commit record, written last
    <store>/<recipe>/<target>/latest           the build hash of the newest published artifact
    <store>/<recipe>/<target>/.tmp-*           uploads in progress (never read)

Publishing is atomic for readers: files are uploaded under a ``.tmp-*`` name, moved to the
build-hash folder (one rename on a local filesystem), then ``published.json`` (every file's
sha256) is written, then ``latest``. A cell counts as present only when its ``published.json``
exists, so an upload killed at any point is invisible, and the next publish replaces it. Small
files (record, pointer) are written to a temp name and moved, so a reader sees the old or the
new content. The build hash is :func:`trtpipe.pipeline.recipe.build_hash` (the recipe's
build-relevant fields), the same one the manifest records in ``build_info.build_hash``.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.manifest import sha256_file

RECORD_NAME = "published.json"
LATEST_NAME = "latest"
RECORD_VERSION = 1


class StoreError(TrtpipeError):
    """The store cannot be read or written, or holds something other than what its record says."""


@dataclass(frozen=True)
class StoredArtifact:
    """One published artifact: what ``published.json`` says about it."""

    recipe: str
    target: str
    build_hash: str
    url: str  # the build-hash folder, as an fsspec URL or local path
    files: dict[str, str]  # path relative to the folder (posix) -> sha256 hex; validate/ included
    published_at: str  # UTC, ISO 8601
    node: str | None = None  # where it was built
    validate: str | None = None  # "PASS" when validated before publishing, None when not validated
    extra: dict[str, Any] = field(default_factory=dict)


def _iter_files(artifact_dir: Path) -> list[str]:
    """Relative posix paths of every regular file under ``artifact_dir``, hidden ones excluded
    (``.<name>.tmp-*`` left by interrupted writes), sorted."""
    out = []
    for p in sorted(artifact_dir.rglob("*")):
        rel = p.relative_to(artifact_dir)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out.append(rel.as_posix())
    return out


class ArtifactStore:
    """An artifact store at ``url`` (a folder path or any fsspec URL). Raises :class:`StoreError`."""

    def __init__(self, url: str | Path):
        import fsspec

        self.url = str(url)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as e:
            raise StoreError(
                f"store {self.url!r}: {e}. Fix: a local folder, memory://..., or an fsspec URL whose "
                "backend is installed (e.g. s3fs for s3://)."
            ) from e
        self.root = self.root.rstrip("/") or "/"

    # ---------------------------------------------------------------------------------- paths
    def _target_dir(self, recipe: str, target: str) -> str:
        return posixpath.join(self.root, recipe, target)

    def cell_path(self, recipe: str, target: str, build_hash: str) -> str:
        """``<root>/<recipe>/<target>/<build_hash>`` (filesystem path, without protocol)."""
        return posixpath.join(self._target_dir(recipe, target), build_hash)

    def _url(self, path: str) -> str:
        return self.fs.unstrip_protocol(path) if "://" in self.url else path

    # ---------------------------------------------------------------------------------- reads
    def require_exists(self, recipe: str = "RECIPE") -> None:
        """Raise :class:`StoreError` when the store's folder does not exist, so that a reader given
        a wrong path is told so instead of reading an empty store. (Writers create it.)"""
        try:
            there = self.fs.exists(self.root)
        except OSError as e:
            raise StoreError(f"store {self.url}: cannot be read ({e}). Fix: check the path or URL.") from e
        if not there:
            raise StoreError(
                f"store {self.url} does not exist (no such folder). Fix: check the path (--store or "
                f"$TRTPIPE_STORE), or publish to it first: `trtpipe farm build {recipe} --store {self.url}`."
            )

    def lookup(self, recipe: str, target: str, build_hash: str) -> StoredArtifact | None:
        """The published artifact with this build hash, or None (absent or never committed)."""
        rec = posixpath.join(self.cell_path(recipe, target, build_hash), RECORD_NAME)
        try:
            if not self.fs.exists(rec):
                return None
            doc = json.loads(self.fs.cat_file(rec).decode("utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(
                f"store record {self._url(rec)} is unreadable ({e}). Fix: delete that build-hash "
                "folder and publish again."
            ) from e
        if doc.get("record_version") != RECORD_VERSION or doc.get("build_hash") != build_hash:
            raise StoreError(
                f"store record {self._url(rec)} is not a version-{RECORD_VERSION} record of build "
                f"{build_hash[:12]}. Fix: delete that folder and publish again."
            )
        return StoredArtifact(
            recipe=doc["recipe"],
            target=doc["target"],
            build_hash=build_hash,
            url=self._url(self.cell_path(recipe, target, build_hash)),
            files=dict(doc["files"]),
            published_at=doc["published_at"],
            node=doc.get("node"),
            validate=doc.get("validate"),
            extra=dict(doc.get("extra") or {}),
        )

    def latest(self, recipe: str, target: str) -> StoredArtifact | None:
        """The artifact ``latest`` points at, or None when nothing was published for the cell."""
        ptr = posixpath.join(self._target_dir(recipe, target), LATEST_NAME)
        try:
            if not self.fs.exists(ptr):
                return None
            build_hash = self.fs.cat_file(ptr).decode("utf-8").strip()
        except OSError as e:
            raise StoreError(f"store pointer {self._url(ptr)} is unreadable ({e}).") from e
        found = self.lookup(recipe, target, build_hash)
        if found is None:
            raise StoreError(
                f"store pointer {self._url(ptr)} names build {build_hash[:12]}, which has no "
                f"{RECORD_NAME}. Fix: publish that recipe again (trtpipe farm build)."
            )
        return found

    def published(self) -> list[tuple[str, str]]:
        """(recipe, target) pairs with a ``latest`` pointer."""
        try:
            ptrs = self.fs.glob(posixpath.join(self.root, "*", "*", LATEST_NAME))
        except (OSError, FileNotFoundError):
            return []
        return sorted(tuple(posixpath.relpath(p, self.root).split("/")[:2]) for p in ptrs)  # type: ignore[misc]

    # --------------------------------------------------------------------------------- writes
    def _write_small(self, path: str, data: bytes) -> None:
        """Write a small file through a temp name and a move (a reader sees old or new bytes)."""
        d, name = posixpath.split(path)
        tmp = posixpath.join(d, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
        self.fs.makedirs(d, exist_ok=True)
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def publish(
        self,
        artifact_dir: str | Path,
        *,
        recipe: str,
        target: str,
        build_hash: str,
        node: str | None = None,
        validate: str | None = None,
        extra: dict[str, Any] | None = None,
        log: Callable[[str], None] = lambda s: None,
    ) -> tuple[StoredArtifact, bool]:
        """Upload ``artifact_dir`` as ``<recipe>/<target>/<build_hash>`` and point ``latest`` at it.

        Returns (the stored artifact, True) or, when that build hash is already published,
        (the existing one, False) without uploading. Interrupted at any point, the store holds
        no visible partial artifact (see the module docstring).
        """
        existing = self.lookup(recipe, target, build_hash)
        if existing is not None:
            return existing, False
        src = Path(artifact_dir)
        rels = _iter_files(src)
        if "manifest.json" not in rels:
            raise StoreError(f"{src} has no manifest.json: not a complete artifact; nothing published.")
        files = {rel: sha256_file(src / rel) for rel in rels}
        cell = self.cell_path(recipe, target, build_hash)
        tmp = posixpath.join(self._target_dir(recipe, target), f".tmp-{build_hash[:16]}-{uuid.uuid4().hex[:8]}")
        try:
            for rel in rels:
                dst = posixpath.join(tmp, rel)
                self.fs.makedirs(posixpath.dirname(dst), exist_ok=True)
                self.fs.put_file(str(src / rel), dst)
            log(f"uploaded {len(rels)} files to {self._url(tmp)}")
            if self.fs.exists(cell):  # an upload that died before its record, or a racing publisher
                if self.lookup(recipe, target, build_hash) is not None:
                    self.fs.rm(tmp, recursive=True)
                    return self.lookup(recipe, target, build_hash), False  # type: ignore[return-value]
                self.fs.rm(cell, recursive=True)
            self.fs.mv(tmp, cell, recursive=True)
            record = {
                "record_version": RECORD_VERSION,
                "recipe": recipe,
                "target": target,
                "build_hash": build_hash,
                "files": files,
                "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "node": node,
                "validate": validate,
                "extra": extra or {},
            }
            self._write_small(posixpath.join(cell, RECORD_NAME), json.dumps(record, indent=1).encode())
            self._write_small(posixpath.join(self._target_dir(recipe, target), LATEST_NAME), f"{build_hash}\n".encode())
        except BaseException:
            try:
                if self.fs.exists(tmp):
                    self.fs.rm(tmp, recursive=True)
            except Exception:
                pass
            raise
        stored = self.lookup(recipe, target, build_hash)
        assert stored is not None
        log(f"published {stored.url}")
        return stored, True

    def fetch(self, stored: StoredArtifact, dest: str | Path) -> None:
        """Download every file of ``stored`` into the (new or empty) folder ``dest`` and check each
        sha256 against the store record. Raises :class:`StoreError` naming the file that differs."""
        dest = Path(dest)
        cell = self.cell_path(stored.recipe, stored.target, stored.build_hash)
        for rel, digest in stored.files.items():
            local = dest / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get_file(posixpath.join(cell, rel), str(local))
            except (OSError, FileNotFoundError) as e:
                raise StoreError(f"{stored.url}/{rel}: cannot download ({e}). Fix: publish the artifact again.") from e
            got = sha256_file(local)
            if got != digest:
                raise StoreError(
                    f"{stored.url}/{rel}: sha256 {got[:12]}... differs from the store record "
                    f"({digest[:12]}...): the stored copy is corrupted. Fix: delete {stored.url} and "
                    "publish again (trtpipe farm build)."
                )


def record_dict(stored: StoredArtifact) -> dict[str, Any]:
    """JSON-ready view of a stored artifact (for the matrix report)."""
    return asdict(stored)
