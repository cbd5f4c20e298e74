"""Recipe errors: one :class:`RecipeProblem` per thing wrong (key path, value, expected, fix), all
of them raised together as one :class:`RecipeError`.

Rendered one line per problem::

    recipe x.yaml: kv_cache.block_size = 24: expected a power of two (...). Fix: use 16 or 32

Validators raise :func:`fail` with :class:`Issue` records (paths relative to the validated object);
:func:`issue_to_problem` turns them into problems with the full key path. This module imports
nothing else of the recipe package, so every other recipe module (and the model-source resolver)
can raise these errors without an import circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic_core import PydanticCustomError

from trtpipe.plugins.core.errors import TrtpipeError


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


MISSING: Any = _Missing()  # the value of a required key that is absent
NO_VALUE: Any = object()  # a problem about the file itself (not found, bad YAML): no key, no value


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class RecipeProblem:
    """One thing wrong with a recipe: the key path, the value found, what was expected, the fix."""

    path: str  # "kv_cache.block_size", "validate.scenarios[0].name"; "" for the file itself
    value: Any
    expected: str
    fix: str

    def render(self, origin: str) -> str:
        """``recipe <origin>: <path> = <value!r>: expected <expected>. Fix: <fix>``."""
        if self.value is NO_VALUE:
            head = f"recipe {origin}: " + (f"{self.path}: " if self.path else "")
        else:
            head = f"recipe {origin}: {self.path or '(recipe)'} = {_short_repr(self.value)}: "
        return f"{head}expected {self.expected}. Fix: {self.fix}"


class RecipeError(TrtpipeError, ValueError):
    """A recipe that cannot be used. ``problems`` lists every problem found; the message has one
    line per problem (see :meth:`RecipeProblem.render`)."""

    def __init__(self, origin: str, problems: Sequence[RecipeProblem]):
        self.origin = origin
        self.problems: tuple[RecipeProblem, ...] = tuple(problems)
        super().__init__("\n".join(p.render(origin) for p in self.problems))


class Issue(NamedTuple):
    """A problem raised from inside a validator; ``path`` is relative to the validated object."""

    path: tuple[str | int, ...]
    value: Any
    expected: str
    fix: str


def fail(*issues: Issue) -> PydanticCustomError:
    """The pydantic error a validator raises for ``issues`` (all reported, each at its own key)."""
    # The issues ride in the error context; problems_from_validation_error unpacks them so a
    # cross-field check can point at the exact key (pydantic would point at the whole model).
    return PydanticCustomError(
        "recipe", "{summary}", {"summary": "; ".join(i.expected for i in issues), "issues": list(issues)}
    )


def format_path(loc: Sequence[str | int]) -> str:
    """``("validate", "scenarios", 0, "name")`` -> ``validate.scenarios[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def issue_to_problem(loc: tuple, issue: Issue) -> RecipeProblem:
    """An :class:`Issue` raised inside the object at ``loc`` as a :class:`RecipeProblem`."""
    return RecipeProblem(format_path(loc + tuple(issue.path)), issue.value, issue.expected, issue.fix)
