"""Package stage: graphs with one shared weights file, staging folders and the atomic publish.

Every build writes into a hidden staging folder beside its destination (``.<name>.tmp-<pid>``)
and swaps it in only when complete (:func:`publish_dir`), so a failed or interrupted build
leaves the previous artifact (or build spec) intact; :func:`remove_stale_temp_dirs` deletes the
staging folders of builds that were killed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtpipe.plugins.core.dtypes import DTYPES
from trtpipe.runtime.artifact.manifest import MANIFEST_NAME

DATA_FILE = "weights.data"
DATA_ALIGN_BYTES = 4096  # page-aligned tensors: mmap-friendly
SHARED_MIN_BYTES = 1024  # smaller initializers stay inside their graph
# initializer types the runtime can hand to several sessions as one buffer (onnx type -> numpy name)
_SHAREABLE = {DTYPES[n].onnx_type: DTYPES[n].numpy_name for n in ("fp32", "fp16", "uint8", "int64")}

# name -> (numpy dtype name, shape, byte offset in weights.data, byte length)
SharedInitializers = dict[str, tuple[str, list[int], int, int]]


def _externalize(t: Any, offset: int, length: int) -> None:
    """Point initializer ``t`` at ``DATA_FILE[offset:offset + length]`` and drop its inline bytes."""
    import onnx

    t.ClearField("raw_data")
    del t.float_data[:], t.int32_data[:], t.int64_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    del t.external_data[:]
    for k, v in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def write_graphs_shared(models: dict[str, Any], out_dir: Path) -> SharedInitializers:
    """Save ONNX graphs (``<key>.onnx``) with all initializers of 1 KiB or more in one
    ``weights.data`` (4 KiB aligned, deduplicated).

    An initializer with the same name and bytes in several graphs is stored once and listed in
    the returned dict so the runtime can hand one buffer to every session. Same name, different
    bytes: later graphs get it renamed to ``<key>/<name>``.
    """
    import onnx
    from onnx import numpy_helper

    seen: dict[str, tuple[str, int, int]] = {}  # name -> (digest, offset, length)
    users: dict[str, set[str]] = {}
    offset = 0
    with open(out_dir / DATA_FILE, "wb") as f:
        for key, model in models.items():
            renames: dict[str, str] = {}
            for t in model.graph.initializer:
                raw = numpy_helper.to_array(t).tobytes() if not t.raw_data else t.raw_data
                if len(raw) < SHARED_MIN_BYTES:
                    continue
                digest = hashlib.sha256(raw).hexdigest()
                if t.name in seen and seen[t.name][0] != digest:
                    new_name = f"{key}/{t.name}"
                    renames[t.name] = new_name
                    t.name = new_name
                if t.name not in seen:
                    pad = (-offset) % DATA_ALIGN_BYTES
                    f.write(b"\0" * pad + raw)
                    seen[t.name] = (digest, offset + pad, len(raw))
                    offset += pad + len(raw)
                users.setdefault(t.name, set()).add(key)
                _externalize(t, *seen[t.name][1:])
            for n in model.graph.node if renames else ():
                for i, x in enumerate(n.input):
                    if x in renames:
                        n.input[i] = renames[x]
            onnx.save_model(model, str(out_dir / f"{key}.onnx"))
    shared: SharedInitializers = {}
    for model in models.values():
        for t in model.graph.initializer:
            if len(users.get(t.name, ())) > 1 and t.name not in shared and t.data_type in _SHAREABLE:
                _, off, ln = seen[t.name]
                shared[t.name] = (_SHAREABLE[t.data_type], list(t.dims), off, ln)
    return shared


@contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """A fresh ``.<final name>.tmp-<pid>`` folder beside ``final``; removed when the block raises
    (the caller publishes it on success)."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(tmp: Path, final: Path) -> None:
    """Swap ``tmp`` in for ``final`` with two renames on one filesystem (a reader sees the old
    folder or the new one, never a mix), then drop the old one."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def publish_artifact(tmp: Path, final: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """Swap a complete temp artifact folder in: final -> .old, tmp -> final, drop .old.

    The previous artifact's validate reports are kept (:func:`keep_previous_reports`); returns
    where they went (None when there were none) and says so through ``log``.
    """
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    kept = keep_previous_reports(old, tmp) if old.exists() else None
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    if kept is not None:
        kept = final / kept.relative_to(tmp)
        if log is not None:
            log(f"kept the previous artifact's validate reports in {kept}")
    return kept


def keep_previous_reports(old: Path, new: Path) -> Path | None:
    """Move ``old/validate/`` into ``new/validate/previous-<old build hash[:12]>/``.

    Reports the old artifact itself kept (``previous-*``) move up beside it first, so history
    stays one level deep; where a rebuild from the same inputs finds its name taken (the hash of
    an earlier build), the folder is ``previous-<hash>-2``, ``-3``, ... Nothing is overwritten or
    dropped. Returns the new folder, or None when the old artifact had no reports.
    """
    src = old / "validate"
    if not src.is_dir() or not any(src.iterdir()):
        return None
    try:
        m = json.loads((old / MANIFEST_NAME).read_text(encoding="utf-8"))
        tag = (m.get("build_info") or {}).get("build_hash") or m["recipe"]["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        tag = "unknown"
    dst_root = new / "validate"
    dst_root.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.glob("previous-*")):  # earlier history, one level deep
        os.replace(p, dst_root / p.name)
    dst = dst_root / f"previous-{str(tag)[:12]}"
    for n in itertools.count(2):
        if not dst.exists():
            break
        dst = dst_root / f"previous-{str(tag)[:12]}-{n}"
    dst.mkdir()
    for p in sorted(src.iterdir()):
        os.replace(p, dst / p.name)
    return dst


def remove_stale_temp_dirs(final: Path, log: Callable[[str], None]) -> None:
    """Delete ``.<target>.tmp-<pid>`` / ``.old-<pid>`` folders left by builds that were killed."""
    if not final.parent.is_dir():
        return
    for p in final.parent.glob(f".{final.name}.*-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that build is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        log(f"removed {p} (left by an interrupted build)")
