"""The structured-output fields: OpenAI's ``response_format`` and vLLM's ``guided_json`` /
``structured_outputs`` names, to one :class:`StructuredOutput` (or None: free text).

    response_format: {"type": "text"}                                       -> None
                     {"type": "json_object"}                                -> any JSON object
                     {"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
                                                            "strict": bool, "description": ...}}
    guided_json: {...schema...} | "<schema JSON text>"                      (vLLM, older name)
    structured_outputs: {"json": {...schema...} | "<text>"} | {"json_object": true}   (vLLM)

At most one of the three may ask for a shape. Whether llguidance can compile the schema is known
only against the tokenizer: :meth:`GrammarCompiler.compile` answers that (a 400 naming the path).
"""

from __future__ import annotations

import re
from typing import Any

from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.sample.structured import StructuredOutput
from trtpipe.runtime.serve.errors import ServeError, bad_field

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name


def parse_structured(doc: dict) -> StructuredOutput | None:
    """The one shape the request asks for, or None; 400 naming the field otherwise."""
    asked = [(name, doc[name]) for name in ("response_format", "guided_json", "structured_outputs") if doc.get(name)]
    shapes = [(name, _parse_one(name, value)) for name, value in asked]
    shapes = [(name, so) for name, so in shapes if so is not None]
    if len(shapes) > 1:
        names = " and ".join(n for n, _ in shapes)
        raise bad_field(
            shapes[1][0], doc[shapes[1][0]], f"one structured-output field, not {names}", "send one of them"
        )
    return shapes[0][1] if shapes else None


def _parse_one(name: str, value: Any) -> StructuredOutput | None:
    if name == "guided_json":
        return _schema("guided_json", value)
    if name == "structured_outputs":
        if not isinstance(value, dict) or not set(value) <= {"json", "json_object"}:
            raise bad_field(
                name, value, '{"json": <schema>} or {"json_object": true} (the forms trtpipe supports)', "send one"
            )
        if value.get("json") is not None:
            return _schema("structured_outputs.json", value["json"])
        return StructuredOutput.json_object() if value.get("json_object") is True else None
    return _response_format(value)


def _response_format(rf: Any) -> StructuredOutput | None:
    fix = 'send {"type": "json_schema", "json_schema": {"name": "answer", "schema": {...}}}'
    kinds = '{"type": "text" | "json_object" | "json_schema"}'
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_field("response_format", rf, kinds, fix)
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return StructuredOutput.json_object()
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad_field("response_format.json_schema", js, '{"name": ..., "schema": {...}}', fix)
    if not isinstance(js.get("name"), str) or not _NAME.match(js["name"]):
        raise bad_field(
            "response_format.json_schema.name", js.get("name"), "1-64 characters of a-z, A-Z, 0-9, _ or -", fix
        )
    if js.get("strict") is not None and not isinstance(js["strict"], bool):
        raise bad_field("response_format.json_schema.strict", js["strict"], "true or false", "send a JSON boolean")
    if "schema" not in js:
        raise bad_field("response_format.json_schema.schema", None, "a JSON Schema object", fix)
    return _schema("response_format.json_schema.schema", js["schema"])


def _schema(param: str, schema: Any) -> StructuredOutput:
    try:
        return StructuredOutput.json_schema(schema)
    except RequestError as e:
        raise ServeError(400, f"{param}: {e}", param=param) from None


__all__ = ["parse_structured"]
