"""pydantic's ValidationError -> :class:`RecipeProblem` lines that name the key, the value, what
was expected and the fix (a did-you-mean for misspelt keys and options, an example from the schema).

Problems raised by the recipe's own validators (:func:`~trtpipe.pipeline.recipe.errors.fail`) ride
in the error context and are unpacked as they are; pydantic's built-in error types are explained by
walking the schema along the error's location.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from trtpipe.pipeline.recipe.errors import MISSING, RecipeProblem, format_path, issue_to_problem
from trtpipe.pipeline.recipe.schema import Recipe
from trtpipe.plugins.core.dtypes import BY_NUMPY_NAME

# spellings of the recipe's dtype options beyond the numpy names the dtype table knows
# (plugins/core/dtypes.py: float16 -> fp16, ...), matched before the did-you-mean; fp8: no trtpipe
# pool or GEMM takes it (Orin has no FP8), the 1-byte option is int8
DTYPE_ALIASES = {
    "half": "fp16",
    "f16": "fp16",
    "float": "fp32",
    "f32": "fp32",
    "fp8": "int8",
    "fp8_e4m3": "int8",
    "fp8_e5m2": "int8",
}


def _option_hint(value: Any, options: Sequence[str]) -> str | None:
    """The option ``value`` most likely means: the option in other letter case, its numpy name
    (``float16``), an alias (:data:`DTYPE_ALIASES`), else the closest spelling (difflib), else None."""
    low = str(value).strip().lower()
    alias = low if low in options else BY_NUMPY_NAME[low].name if low in BY_NUMPY_NAME else DTYPE_ALIASES.get(low)
    if alias in options:
        return f"'{alias}'" + (" (no FP8 here: the 1-byte option is int8)" if low.startswith("fp8") else "")
    close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
    return f"'{close[0]}'" if close else None


def _unwrap(ann: Any) -> Any:
    """``X | None`` -> X; ``tuple[X, ...]`` / ``list[X]`` stay as they are."""
    if get_origin(ann) in (Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


def _field_by_key(cls: type[BaseModel], key: str) -> Any:
    for name, info in cls.model_fields.items():
        if (info.alias or name) == key:
            return info
    return None


def _lookup(loc: Sequence[str | int]) -> tuple[Any, Any]:
    """Walk the schema along ``loc``: (FieldInfo of the last key or None, annotation there)."""
    ann: Any = Recipe
    info = None
    for part in loc:
        ann = _unwrap(ann)
        if isinstance(part, int):
            args = get_args(ann)
            ann = args[0] if args else None
            continue
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None, None
        info = _field_by_key(ann, part)
        if info is None:
            return None, None
        ann = info.annotation
    return info, _unwrap(ann)


def _keys_of(ann: Any) -> list[str]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [info.alias or name for name, info in ann.model_fields.items()]
    return []


def _example(loc: Sequence[str | int], info: Any) -> str:
    key = next((p for p in reversed(loc) if isinstance(p, str)), "")
    if info is not None and info.examples:
        ex = info.examples[0]
        return f"`{key}: {ex}`"
    return ""


def _explain(e: dict[str, Any]) -> tuple[str, str]:
    """(expected, fix) for one of pydantic's built-in error types."""
    loc, typ, ctx = tuple(e["loc"]), e["type"], e.get("ctx") or {}
    info, ann = _lookup(loc)
    example = _example(loc, info)
    eg = f", e.g. {example}" if example else ""
    key = format_path(loc)

    if typ == "missing":
        return "a value (this key is required)", f"add {example or f'`{loc[-1]}: ...`'}"
    if typ == "extra_forbidden":
        _, parent = _lookup(loc[:-1])
        allowed = _keys_of(parent)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        fix = f"did you mean '{close[0]}'? Rename the key" if close else "remove the key, or check its indentation"
        where = format_path(loc[:-1]) or "the top level"
        return f"a known key at {where} ({', '.join(allowed)})", fix
    if typ == "literal_error":
        options = [str(a) for a in get_args(ann)] if get_origin(ann) is Literal else []
        expected = ("one of " + ", ".join(repr(o) for o in options)) if options else f"one of {ctx.get('expected')}"
        hint = _option_hint(e["input"], options)
        fix = f"did you mean {hint}?" if hint else f"use {expected}"
        return expected, fix
    if typ in ("int_type", "int_parsing", "int_from_float"):
        return "an integer", f"write a whole number without quotes{eg}"
    if typ == "finite_number":  # YAML's .inf / .nan where allow_inf_nan=False
        return "a finite number", f"write a finite number, not .inf or .nan{eg}"
    if typ in ("float_type", "float_parsing"):
        value = e.get("input")
        if isinstance(value, str) and "e" in value.lower() and "." not in value:
            try:
                float(value)
            except ValueError:
                pass
            else:  # YAML 1.1 reads 1e-5 as a string: the mantissa needs a dot
                return "a number", f"write {value} as {value.lower().replace('e', '.0e', 1)}"
        return "a number", f"write a number without quotes{eg}"
    if typ in ("bool_type", "bool_parsing"):
        return "true or false", "write true or false without quotes"
    if typ == "string_type":
        return "a string", f"quote the value{eg}"
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[typ]
        bound = next(iter(ctx.values()), "?")
        positive = (op, bound) in ((">", 0), (">=", 1))  # "positive" only where 0 is refused
        return (f"a value {op} {bound}", (f"use a positive value{eg}" if positive else f"use a value {op} {bound}{eg}"))
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        keys = _keys_of(ann)
        hint = f" (keys: {', '.join(keys)})" if keys else ""
        return f"a mapping{hint}", f"write `{loc[-1] if loc else 'key'}:` followed by indented `key: value` lines"
    if typ in ("tuple_type", "list_type"):
        return "a list", "write one `- item` per line under the key"
    return e.get("msg", "a valid value"), f"correct {key}{eg}"


def problems_from_validation_error(err: ValidationError) -> list[RecipeProblem]:
    """Every error of ``err`` (a :class:`Recipe` validation) as a :class:`RecipeProblem`."""
    out: list[RecipeProblem] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "recipe":
            out.extend(issue_to_problem(loc, i) for i in e["ctx"]["issues"])
            continue
        expected, fix = _explain(e)
        value = MISSING if e["type"] == "missing" else e.get("input")
        out.append(RecipeProblem(format_path(loc), value, expected, fix))
    return out
