"""Reading recipes: a path or a shipped recipe name -> YAML (duplicate keys refused) -> a validated
:class:`Recipe`, every problem reported at once as a :class:`RecipeError`."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trtpipe.pipeline.recipe.checks import model_issues, recipe_issues
from trtpipe.pipeline.recipe.errors import NO_VALUE, RecipeError, RecipeProblem, issue_to_problem
from trtpipe.pipeline.recipe.pydantic_errors import problems_from_validation_error
from trtpipe.pipeline.recipe.schema import Recipe

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"  # shipped recipes (source tree)
DEFAULT_RECIPE_NAME = "smollm2-135m-cpu"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # unhashable key: let SafeLoader report it
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first set at line {first + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


# PyYAML contexts that name where an unfinished construct began (e.g. "while scanning a simple
# key": a `key` line without its colon; "while parsing a flow mapping": a `{` never closed)
_OPENED_AT = ("while scanning a simple key", "while parsing a flow", "while scanning a quoted scalar")


def _yaml_problem(exc: yaml.YAMLError) -> RecipeProblem:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc)
    start, context = getattr(exc, "context_mark", None), getattr(exc, "context", None) or ""
    if start is not None and mark is not None and start.line < mark.line and context.startswith(_OPENED_AT):
        # a key, a {...}/[...] or a quoted string opened on an earlier line and never closed:
        # PyYAML notices where it gives up (the next line); the mistake is where it opened
        where = f"line {start.line + 1}, column {start.column + 1}"
        what = f"{context.removeprefix('while ')} that starts here: {what} (noticed at line {mark.line + 1})"
    return RecipeProblem(
        where, NO_VALUE, f"valid YAML ({what})", "fix the YAML there (indent with spaces, `key: value`, each key once)"
    )


def parse_recipe(
    data: Any, *, origin: str = "<recipe>", base_dir: Path | None = None, check_files: bool = False
) -> Recipe:
    """Validate already-parsed YAML data (a dict) into a :class:`Recipe`.

    ``origin`` names the recipe in errors; ``base_dir`` is where relative paths are resolved.
    With ``check_files`` the model source and prompt files must exist. Raises
    :class:`RecipeError` listing every problem.
    """
    if not isinstance(data, dict):
        raise RecipeError(
            origin,
            [
                RecipeProblem(
                    "",
                    data,
                    "a mapping of keys at the top level (name, model, target, precision, ...)",
                    f"start from recipes/{DEFAULT_RECIPE_NAME}.yaml",
                )
            ],
        )
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(origin, problems_from_validation_error(err)) from None
    recipe._origin = origin
    recipe._base_dir = base_dir
    issues = recipe_issues(recipe)  # checks across sections, once every section is valid
    if recipe.model.architecture is not None:
        issues += model_issues(recipe, recipe.model.architecture.to_model_config(), "model.architecture")
    if issues:
        raise RecipeError(origin, [issue_to_problem((), i) for i in issues])
    if check_files:
        _check_files(recipe)
    return recipe


def _check_files(recipe: Recipe) -> None:
    problems: list[RecipeProblem] = []
    try:
        recipe.resolve_source()
    except RecipeError as err:
        problems.extend(err.problems)
    for i, s in enumerate(recipe.validation.scenarios):
        f = s.prompt_tokens.file
        if f is not None and not recipe.resolve_path(f).is_file():
            problems.append(
                RecipeProblem(
                    f"validate.scenarios[{i}].prompt_tokens.file",
                    f,
                    f"an existing prompt file ({recipe.resolve_path(f)})",
                    "fix the path (relative to the recipe's folder)",
                )
            )
    if problems:
        raise RecipeError(recipe.origin, problems)


def load_recipe(path: str | Path, *, check_files: bool = True) -> Recipe:
    """Read, parse and validate a recipe YAML file.

    ``check_files``: also require the model source (:func:`resolve_model_source`) and prompt
    files to exist (turn off for planning from a recipe whose weights live elsewhere).
    Raises :class:`RecipeError` for a missing file, a YAML syntax error or duplicate key (with
    its line), and every schema problem.
    """
    path = Path(path)
    origin = str(path)
    if not path.is_file():
        raise RecipeError(
            origin,
            [
                RecipeProblem(
                    "",
                    NO_VALUE,
                    "an existing recipe file",
                    f"check the path; shipped recipes are in {RECIPES_DIR} (e.g. {DEFAULT_RECIPE_NAME}.yaml)",
                )
            ],
        )
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise RecipeError(origin, [_yaml_problem(exc)]) from None
    except UnicodeDecodeError as exc:
        raise RecipeError(
            origin,
            [
                RecipeProblem(
                    "",
                    NO_VALUE,
                    f"a UTF-8 text (YAML) file; byte {exc.start} is not valid UTF-8",
                    "pass the recipe's .yaml file, saved as UTF-8",
                )
            ],
        ) from None
    return parse_recipe(data, origin=origin, base_dir=path.parent.resolve(), check_files=check_files)


def shipped_recipe_names() -> list[str]:
    """Names (file stems) of the recipes shipped in ``recipes/``."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    """A recipe file from a path, or from a shipped recipe name (``smollm2-135m-cpu``).
    Raises :class:`RecipeError` with a did-you-mean when neither exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = shipped_recipe_names()
    close = difflib.get_close_matches(str(name_or_path), names, n=1)
    if close:
        fix = f"did you mean '{close[0]}'?"
    elif p.suffix in (".yaml", ".yml") or len(p.parts) > 1:  # meant as a path: say it is missing
        fix = f"no such file or folder: {p}; check the path, or use one of the shipped recipes {names}"
    else:
        fix = f"use a path or one of {names}"
    raise RecipeError(
        str(name_or_path), [RecipeProblem("", NO_VALUE, "a recipe file or the name of a shipped recipe", fix)]
    )
