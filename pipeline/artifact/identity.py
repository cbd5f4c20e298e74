"""Where an artifact lives, what decides whether it must be rebuilt, and how to rebuild it."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from trtpipe.pipeline.recipe import Recipe, build_hash
from trtpipe.plugins.core.versions import TRTPIPE_VERSION


def root_file_problem(root: str | Path) -> str | None:
    """Why ``root`` cannot be an artifacts root because it, or a folder above it, is a file (one
    sentence naming that file and the fix); None when it is a folder or does not exist yet."""
    p = Path(root)
    for q in (p, *p.parents):
        if q.exists():
            if q.is_dir():
                return None
            what = "is a file" if q == p else f"has a file above it, {q}"
            return (
                f"the artifacts root {p} {what}; expected a folder (it holds <recipe>/<target> artifact "
                "folders and is created when missing). Fix: pass a folder, e.g. --artifacts artifacts, "
                "or move the file away"
            )
    return None


def artifact_dir_for(recipe: Recipe, root: str | Path = "artifacts") -> Path:
    """``<root>/<recipe name>/<target>``."""
    return Path(root) / recipe.name / recipe.target


def rebuild_command(recipe: Recipe, artifact_root: str | Path = "artifacts") -> str:
    """``trtpipe build ... --force`` that rebuilds ``recipe`` into ``artifact_root``
    (:func:`build_command`)."""
    return build_command(recipe, artifact_root) + " --force"


def build_command(recipe: Recipe, artifact_root: str | Path = "artifacts") -> str:
    """``trtpipe build ...`` that builds ``recipe`` into ``artifact_root``: a shipped recipe by
    name, any other by its absolute path; ``--artifacts`` unless it is ./artifacts."""
    from trtpipe.pipeline.recipe import RECIPES_DIR

    origin = Path(recipe.origin)
    target = recipe.name
    if origin.is_file() and origin.resolve().parent != RECIPES_DIR.resolve():
        target = str(origin.resolve())
    cmd = f"trtpipe build {shlex.quote(target)}"
    if Path(artifact_root).resolve() != Path("artifacts").resolve():
        cmd += f" --artifacts {shlex.quote(str(Path(artifact_root).resolve()))}"
    return cmd


def inputs_hash(recipe: Recipe, model_path: Path) -> str:
    """sha256 over what determines the artifact: the recipe's build hash, the model file(s) (name,
    size, mtime), the trtpipe version, the artifact format (the KV pool layout), the op ABI hash
    the ONNX Runtime version, and for the native CPU engine the resolved ISA and kernel sources."""
    from trtpipe.plugins.ops.abi import op_schema_abi_hash
    from trtpipe.runtime.artifact.manifest import FORMAT_VERSION

    h = hashlib.sha256()
    h.update(build_hash(recipe).encode())  # budgets/description edits do not force a rebuild
    files = [model_path] if model_path.is_file() else sorted(p for p in model_path.iterdir() if p.is_file())
    for f in files:
        st = f.stat()
        # size + mtime + name keep this fast for 100 MB+ files; the manifest holds real hashes
        h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(TRTPIPE_VERSION.encode())
    h.update(f"format {FORMAT_VERSION}".encode())  # a layout change rebuilds GPU build specs too
    h.update(op_schema_abi_hash().encode())
    if recipe.target == "cpu" and recipe.engine.cpu_backend != "ort":
        from trtpipe.plugins.cpu.compile import sources_hash
        from trtpipe.plugins.cpu.isa import resolve_isa

        # cpu_isa: host resolves per build machine: a build on another CPU kind is another artifact
        h.update(f"cpu kernels {resolve_isa(recipe.engine.cpu_isa)} {sources_hash()}".encode())
    try:
        import onnxruntime

        h.update(onnxruntime.__version__.encode())
    except ImportError:
        pass
    return h.hexdigest()
