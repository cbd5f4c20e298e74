"""``manifest.json``: the only thing the runtime trusts about an artifact directory.

Layout of an artifact (``artifacts/<recipe>/<target>/``)::

    manifest.json          this file (written last: its presence means a complete build)
    prefill.onnx           graphs (ort backend) or prefill.plan / decode.plan (trt backend)
    decode.onnx
    weights.data           external data shared by both graphs (deduplicated by name + bytes)
    tokenizer.json
    golden.json            reference outputs recorded at build time (for validate)

Every file is listed with its sha256. :func:`load_manifest` re-hashes them and compares the
fingerprint (format version, backend and version, target, op-schema ABI hash) with what this
process runs, refusing a mismatch with a message that says what differs and how to rebuild
(TensorRT-LLM's self-describing engine directory is the model).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trtpipe.plugins.core.kv_codec import kv_head_token_bytes
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.artifact.runtime_options import RuntimeOptions, parse_runtime_options
from trtpipe.runtime.errors import ArtifactError

FORMAT_VERSION = 2  # 2: head-major KV pool [kv_heads_l, num_blocks, block_size, head_dim]
MANIFEST_NAME = "manifest.json"


def sha256_file(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk_bytes)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are read by other users (CI, deploy)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class KVLayout:
    """Per-layer paged KV pool: K and V arrays of ``[kv_heads_l, num_blocks, block_size, head_dim]``
    (head-major since format 2, docs/contracts.md: attention reads a sequence's blocks without
    transposes).

    Block 0 is the null block. ``num_blocks`` includes it.
    """

    block_size: int
    num_blocks: int
    dtype: str  # "float32" | "float16" | "bfloat16" | "int8" (kv_cache.dtype; plugins/core/kv_codec.py)
    layer_num_kv_heads: tuple[int, ...]
    head_dim: int
    sliding_window: int  # 0 = off (all layers share one window here)

    def layer_shape(self, layer: int) -> tuple[int, int, int, int]:
        return (self.layer_num_kv_heads[layer], self.num_blocks, self.block_size, self.head_dim)

    @property
    def pool_bytes(self) -> int:
        """K and V of every layer, int8 scales included."""
        row = kv_head_token_bytes(self.dtype, self.head_dim)
        return sum(2 * self.num_blocks * self.block_size * h * row for h in self.layer_num_kv_heads)


@dataclass(frozen=True)
class GraphEntry:
    """One engine of the artifact: its file, precision and I/O names."""

    file: str
    precision: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Limits:
    """What the artifact was built to serve (the recipe's limits): ``max_seq_len`` tokens per
    sequence (prompt + output), ``max_batch_size`` running sequences per decode step,
    ``max_num_tokens`` tokens per prefill step."""

    max_seq_len: int
    max_batch_size: int
    max_num_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {
            "max_seq_len": self.max_seq_len,
            "max_batch_size": self.max_batch_size,
            "max_num_tokens": self.max_num_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Limits:
        """KeyError for a missing limit (load_manifest turns it into an ArtifactError)."""
        return cls(d["max_seq_len"], d["max_batch_size"], d["max_num_tokens"])


@dataclass(frozen=True)
class Manifest:
    format_version: int
    trtpipe_version: str
    recipe_name: str
    recipe_hash: str
    inputs_hash: str
    backend: dict[str, str]  # {"name": "ort", "version": "1.31.1"}
    target: dict[str, Any]  # {"name": "cpu", "platform": "x86_64", "sm": None}
    op_abi_hash: str
    plugin_versions: dict[str, str]
    model: ModelConfig
    kv: KVLayout
    graphs: dict[str, GraphEntry]  # "prefill", "decode"
    files: dict[str, str]  # relative path -> sha256
    limits: Limits
    tokenizer_file: str = "tokenizer.json"
    golden_file: str | None = "golden.json"
    runtime_options: dict[str, Any] = field(default_factory=dict)  # as written; engines read ``options``
    build_info: dict[str, Any] = field(default_factory=dict)
    root: Path | None = field(default=None, compare=False)

    @property
    def rebuild_command(self) -> str:
        """The command that rebuilds this artifact (recorded at build time: the recipe file and
        ``--artifacts`` root it was built with), for the "Fix:" part of errors."""
        return self.build_info.get("rebuild_command") or f"trtpipe build {self.recipe_name} --force"

    @cached_property
    def options(self) -> RuntimeOptions:
        """``runtime_options`` typed and checked (parsed once; :func:`load_manifest` parses it at
        load). Raises :class:`ArtifactError` naming a missing or bad option and the rebuild command."""
        where = str(self.root / MANIFEST_NAME) if self.root is not None else "manifest"
        return parse_runtime_options(self.backend, self.runtime_options, where=where, rebuild=self.rebuild_command)

    def to_json(self) -> str:
        d = {
            "format_version": self.format_version,
            "trtpipe_version": self.trtpipe_version,
            "recipe": {"name": self.recipe_name, "hash": self.recipe_hash},
            "inputs_hash": self.inputs_hash,
            "backend": self.backend,
            "target": self.target,
            "op_abi_hash": self.op_abi_hash,
            "plugin_versions": self.plugin_versions,
            "model": self.model.to_dict(),
            "kv": {**self.kv.__dict__, "layer_num_kv_heads": list(self.kv.layer_num_kv_heads)},
            "graphs": {
                k: {**v.__dict__, "inputs": list(v.inputs), "outputs": list(v.outputs)} for k, v in self.graphs.items()
            },
            "files": self.files,
            "limits": self.limits.to_dict(),
            "tokenizer_file": self.tokenizer_file,
            "golden_file": self.golden_file,
            "runtime_options": self.runtime_options,
            "build_info": self.build_info,
        }
        return json.dumps(d, indent=2, sort_keys=False, default=str)

    @classmethod
    def from_json(cls, text: str, root: Path | None = None) -> Manifest:
        d = json.loads(text)
        kv = dict(d["kv"])
        kv["layer_num_kv_heads"] = tuple(kv["layer_num_kv_heads"])
        return cls(
            format_version=int(d["format_version"]),
            trtpipe_version=d["trtpipe_version"],
            recipe_name=d["recipe"]["name"],
            recipe_hash=d["recipe"]["hash"],
            inputs_hash=d["inputs_hash"],
            backend=d["backend"],
            target=d["target"],
            op_abi_hash=d["op_abi_hash"],
            plugin_versions=d.get("plugin_versions", {}),
            model=ModelConfig.from_dict(d["model"]),
            kv=KVLayout(**kv),
            graphs={
                k: GraphEntry(v["file"], v["precision"], tuple(v["inputs"]), tuple(v["outputs"]))
                for k, v in d["graphs"].items()
            },
            files=d["files"],
            limits=Limits.from_dict(d["limits"]),
            tokenizer_file=d.get("tokenizer_file", "tokenizer.json"),
            golden_file=d.get("golden_file"),
            runtime_options=d.get("runtime_options", {}),
            build_info=d.get("build_info", {}),
            root=root,
        )

    def path(self, rel: str) -> Path:
        assert self.root is not None
        return self.root / rel


def current_fingerprint(backend: str) -> dict[str, Any]:
    """What this process runs: backend version, platform, op ABI hash, format version."""
    from trtpipe.plugins.ops.abi import op_schema_abi_hash

    fp: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "op_abi_hash": op_schema_abi_hash(),
        "platform": platform.machine(),
    }
    if backend == "ort":
        try:
            import onnxruntime

            fp["backend_version"] = onnxruntime.__version__
        except ImportError:
            fp["backend_version"] = None
    return fp


def not_an_artifact_error(folder: str | Path, fix_for: Callable[[str], str] | None = None) -> ArtifactError:
    """The error for a folder without ``manifest.json``, with the folder to pass instead when
    artifacts were built below it: a recipe folder ``<root>/<recipe>/`` holds ``<target>/``
    artifacts, the artifacts root holds ``<recipe>/<target>/``.

    ``fix_for(path)`` words the fix for the caller (the CLI: ``trtpipe info <path>``); default
    "pass <path> instead". A folder that does not exist is said to not exist.
    """
    root = Path(folder)
    if not root.exists():
        return ArtifactError(
            f"{root} does not exist. Fix: check the path, or run `trtpipe build RECIPE` first and pass "
            "the artifact directory it prints."
        )
    fix_for = fix_for or (lambda path: f"pass {path} instead")
    below = sorted({p.parent for pat in ("*/", "*/*/") for p in root.glob(pat + MANIFEST_NAME)})
    if not below:
        return ArtifactError(
            f"{root} is not a trtpipe artifact (no {MANIFEST_NAME}). Fix: run `trtpipe build RECIPE` first, "
            "or pass the artifact directory it printed."
        )
    names = ", ".join(p.relative_to(root).as_posix() for p in below)
    what = "built targets" if below[0].parent == root else "built artifacts (<recipe>/<target>)"
    others = " (or another of them)" if len(below) > 1 else ""
    return ArtifactError(
        f"{root} is not a trtpipe artifact (no {MANIFEST_NAME}); it holds {what}: {names}. "
        f"Fix: {fix_for(below[0].as_posix())}{others}."
    )


def load_manifest(artifact_dir: str | Path, *, verify_hashes: bool = True) -> Manifest:
    """Read and check ``artifact_dir/manifest.json``.

    Raises :class:`ArtifactError` when the directory or manifest is missing or unreadable, a listed
    file is missing or its sha256 differs, or the fingerprint (format version, backend version,
    op-schema ABI hash, platform) does not match this process. Each message names what differs and
    the command that rebuilds the artifact.
    """
    root = Path(artifact_dir)
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        raise not_an_artifact_error(root)
    try:
        m = Manifest.from_json(mpath.read_text(encoding="utf-8"), root=root)
    except (KeyError, ValueError, TypeError) as e:
        raise ArtifactError(f"{mpath} is malformed ({e!r}). Fix: rebuild with `trtpipe build <recipe> --force`.") from e
    rebuild = m.rebuild_command
    bad = [
        f"{k} = {v!r}"
        for k, v in (
            ("kv.block_size", m.kv.block_size),
            ("kv.num_blocks", m.kv.num_blocks),
            ("kv.head_dim", m.kv.head_dim),
            *((f"limits.{k}", v) for k, v in m.limits.to_dict().items()),
        )
        if not isinstance(v, int) or v < (2 if k == "kv.num_blocks" else 1)
    ]
    if bad:
        raise ArtifactError(
            f"{mpath}: {', '.join(bad)}: expected positive integers (2+ blocks: block 0 is the "
            f"null block). The manifest was edited or damaged. Fix: `{rebuild}`."
        )
    fp = current_fingerprint(m.options.backend)  # m.options: ArtifactError for a missing/bad option
    diffs = []
    if m.format_version != fp["format_version"]:
        diffs.append(f"format version {m.format_version} (this runtime reads {fp['format_version']})")
    if m.op_abi_hash != fp["op_abi_hash"]:
        diffs.append(f"op schema ABI hash {m.op_abi_hash[:12]} (this runtime: {fp['op_abi_hash'][:12]})")
    bv = fp.get("backend_version")
    if m.options.backend == "ort" and bv is not None and m.backend.get("version") != bv:
        diffs.append(f"onnxruntime {m.backend.get('version')} (installed: {bv})")
    if m.target.get("platform") and m.target.get("platform") != fp["platform"] and m.options.backend == "trt":
        diffs.append(f"platform {m.target.get('platform')} (this machine: {fp['platform']})")
    if diffs:
        raise ArtifactError(
            f"artifact {root} was built for a different runtime: "
            + "; ".join(diffs)
            + f". Fix: rebuild it here with `{rebuild}`."
        )
    for rel, digest in m.files.items():
        p = root / rel
        if not p.is_file():
            raise ArtifactError(f"artifact {root}: file {rel} is missing. Fix: `{rebuild}`.")
        if verify_hashes and sha256_file(p) != digest:
            raise ArtifactError(
                f"artifact {root}: file {rel} is corrupted (sha256 differs from the manifest). Fix: `{rebuild}`."
            )
    return m
