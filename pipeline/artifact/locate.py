"""Where the deploy-side commands (generate, chat, info, validate) find their artifact.

    RECIPE_OR_ARTIFACT ─┬─ a folder with manifest.json ──────────────► that artifact
                        └─ a recipe (path or shipped name) ─► <root>/<recipe name>/<target>
                             └─ must exist, and its manifest's build hash must be the recipe's
                                (:func:`check_artifact_matches_recipe`)

The artifacts root is ``--artifacts``, else the ``TRTPIPE_ARTIFACTS`` environment variable, else
``./artifacts`` of the current folder (click reads the variable:
:func:`trtpipe.pipeline.cli.common.artifacts_option`).

Only the artifact is read: the recipe is loaded without resolving its model source
(``check_files=False``), so a device that received the artifact but not the model package (or
the GGUF) runs it; the manifest names everything the runtime needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtpipe.runtime.errors import ArtifactError

if TYPE_CHECKING:
    from trtpipe.pipeline.recipe import Recipe
    from trtpipe.runtime.artifact.manifest import Manifest

ARTIFACTS_ENV = "TRTPIPE_ARTIFACTS"
DEFAULT_ARTIFACTS_ROOT = "artifacts"
ROOT_SOURCES = f"--artifacts, else ${ARTIFACTS_ENV}, else ./{DEFAULT_ARTIFACTS_ROOT} of the current folder"


def load_recipe_for_deploy(recipe: str) -> Recipe:
    """A recipe (path or shipped name) for a deploy-side command: schema checked, but its model
    source is not looked up (the artifact carries what the runtime needs). Raises RecipeError."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    return load_recipe(resolve_recipe_path(recipe), check_files=False)


def artifact_dir_fix(path: str | Path = "DIR") -> str:
    """How the running command takes an artifact folder, worded as a fix: ``trtpipe info DIR``,
    ``trtpipe generate DIR ...`` (RECIPE_OR_ARTIFACT commands), ``trtpipe validate RECIPE
    --artifact DIR``; "pass DIR" outside a click command."""
    import shlex

    import click  # the running command names the fix; outside one, "pass DIR"

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return f"pass {path}"
    names, c = [], ctx
    while c.parent is not None:  # the subcommand path under the root group, whatever argv[0] was
        names.append(c.info_name or "")
        c = c.parent
    cmd = " ".join(["trtpipe", *reversed(names)]) if names else "trtpipe"
    params = {p.name: p for p in ctx.command.params}
    if "artifact_dir" in params:
        recipe = ctx.params.get("recipe") or "RECIPE"
        return f"`{cmd} {shlex.quote(str(recipe))} --artifact {shlex.quote(str(path))}`"
    more = any(isinstance(p, click.Argument) and n != "recipe_or_artifact" for n, p in params.items())
    return f"`{cmd} {shlex.quote(str(path))}{' ...' if more else ''}`"


def not_an_artifact_dir(folder: str | Path) -> ArtifactError:
    """:func:`~trtpipe.runtime.artifact.manifest.not_an_artifact_error` with the fix worded for the running
    command (the built folder below ``folder`` passed the way this command takes it)."""
    from trtpipe.runtime.artifact.manifest import not_an_artifact_error

    return not_an_artifact_error(folder, artifact_dir_fix)


def missing_artifact_error(recipe: Recipe, art: Path) -> ArtifactError:
    """The "nothing built here" error of every deploy-side command: the absolute folder looked
    in, how the root is chosen, and the three fixes (build into that root, point the root, pass
    the artifact folder the way the running command takes it: :func:`artifact_dir_fix`), and
    whether the root exists and which ``<recipe>/<target>`` artifacts it holds. A root that is
    itself an artifact folder (or the recipe folder above one) gets its real root instead."""
    import shlex

    from trtpipe.pipeline.artifact.identity import build_command, root_file_problem
    from trtpipe.runtime.artifact.manifest import MANIFEST_NAME

    root = art.parent.parent
    # a root that is an artifact folder, or the recipe folder above one: the folder `build` printed
    for inner, outer in ((root, root.parent.parent), (root / recipe.target, root.parent)):
        if (inner / MANIFEST_NAME).is_file():
            return ArtifactError(
                f"the artifacts root {root.resolve()} is itself an artifact folder (or the recipe folder "
                f"above one), not a root of <root>/<recipe>/<target> folders; no artifact in {art.resolve()}. "
                f"Fix: pass its root, --artifacts {shlex.quote(str(outer.resolve()))}, or the artifact "
                f"folder itself: {artifact_dir_fix(inner)}."
            )
    file_problem = root_file_problem(root)
    if file_problem is not None:
        return ArtifactError(f"no artifact for recipe {recipe.name!r}: {file_problem}.")
    if not root.is_dir():
        there = f"the artifacts root {root.resolve()} does not exist"
    else:
        held = sorted(p.parent.relative_to(root).as_posix() for p in root.glob(f"*/*/{MANIFEST_NAME}"))
        shown = ", ".join(held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "")
        there = f"the root holds {shown}" if held else "the root holds no artifacts"
    return ArtifactError(
        f"no artifact for recipe {recipe.name!r} in {art.resolve()}: {there} (artifacts root: "
        f"{ROOT_SOURCES}). Fix: run `{build_command(recipe, root)}` first, or point --artifacts / ${ARTIFACTS_ENV} "
        f"at the folder it was built in, or pass the artifact folder: {artifact_dir_fix()}."
    )


def check_artifact_matches_recipe(manifest: Manifest, recipe: Recipe, artifact_dir: Path) -> None:
    """Refuse an artifact built from another recipe (or an older version of this one).

    Compares :func:`build_hash` with ``manifest.build_info["build_hash"]`` when the build recorded
    it, else :func:`recipe_hash` with ``manifest.recipe_hash``. Raises :class:`ArtifactError`,
    naming the settings that differ where the build recorded ``build_info["build_fields"]`` (and
    they hash to its build hash).
    """
    from trtpipe.pipeline.artifact.identity import artifact_dir_for, build_command
    from trtpipe.pipeline.recipe import build_fields, build_hash, changed_fields, recipe_hash, sha256_canonical

    have_build = (manifest.build_info or {}).get("build_hash")
    if have_build is not None:
        want, have, what = (
            build_hash(recipe),
            have_build,
            "build hash (all but description, validate and the runtime settings)",
        )
    else:
        want, have, what = recipe_hash(recipe), manifest.recipe_hash, "recipe hash"
    if want != have:
        root = artifact_dir.parent.parent  # the root when artifact_dir is <root>/<recipe>/<target>
        in_root = artifact_dir_for(recipe, root) == artifact_dir
        rebuild = f"`{build_command(recipe, root if in_root else 'artifacts')}`"
        if in_root:  # the build writes where this artifact is
            rebuild += f" (it replaces this artifact; to keep both, give {recipe.origin} another `name:`)"
        else:
            rebuild += f" (it builds into {artifact_dir_for(recipe, Path('artifacts').resolve())}; pass that folder)"
        built_fields = (manifest.build_info or {}).get("build_fields")  # CPU builds since 2026-12-02
        trusted = isinstance(built_fields, dict) and sha256_canonical(built_fields) == have_build
        changes = changed_fields(built_fields, build_fields(recipe)) if trusted else []
        if changes:
            why = f"these build settings differ from the build's: {'; '.join(changes)}"
        else:
            why = "the recipe changed since the build, or this is another recipe's artifact"
        raise ArtifactError(
            f"artifact {artifact_dir.resolve()} was built from recipe {manifest.recipe_name!r} with {what} "
            f"{have[:12]}, but {recipe.origin} ({recipe.name!r}) hashes to {want[:12]}: {why}. Fix: "
            f"rebuild with {rebuild}, or pass the recipe the artifact was built from."
        )


def artifact_for_recipe(recipe: Recipe, artifact_root: str | Path) -> Path:
    """``<root>/<recipe>/<target>``, checked to exist and to be built from ``recipe``."""
    from trtpipe.pipeline.artifact.identity import artifact_dir_for
    from trtpipe.runtime.artifact.manifest import MANIFEST_NAME, load_manifest

    art = artifact_dir_for(recipe, artifact_root)
    if not (art / MANIFEST_NAME).is_file():
        raise missing_artifact_error(recipe, art)
    check_artifact_matches_recipe(load_manifest(art, verify_hashes=False), recipe, art)
    return art


def resolve_artifact(recipe_or_artifact: str, artifact_root: str | Path = DEFAULT_ARTIFACTS_ROOT) -> Path:
    """An artifact directory, or a recipe (path or shipped name) -> its artifact directory.

    Raises :class:`ArtifactError` (no artifact, or one built from another recipe) or
    :class:`~trtpipe.pipeline.recipe.RecipeError`.
    """
    from trtpipe.plugins.core.errors import TrtpipeError

    p = Path(recipe_or_artifact)
    if p.is_dir() and (p / "manifest.json").is_file():
        return p
    try:
        recipe = load_recipe_for_deploy(recipe_or_artifact)
    except TrtpipeError:
        if p.is_dir():
            raise not_an_artifact_dir(p) from None
        raise
    return artifact_for_recipe(recipe, artifact_root)


__all__ = [
    "ARTIFACTS_ENV",
    "artifact_for_recipe",
    "check_artifact_matches_recipe",
    "artifact_dir_fix",
    "load_recipe_for_deploy",
    "missing_artifact_error",
    "not_an_artifact_dir",
    "resolve_artifact",
]
