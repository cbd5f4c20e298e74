"""``StructuredOutput``: what shape a request's output must have (a JSON schema, or any JSON
object), as a frozen record named by a content hash.

The record is plain data (no llguidance objects), so :class:`SamplingParams` stays hashable and
the grammar compiled from it can be cached by :attr:`StructuredOutput.key`
(:mod:`trtpipe.runtime.sample.grammar`). OpenAI's ``response_format`` ``{"type":
"json_object"}`` is the schema ``{"type": "object"}``; ``{"type": "json_schema", ...}`` carries
the schema itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from trtpipe.runtime.errors import RequestError

JSON_OBJECT_SCHEMA = {"type": "object"}  # what "any JSON object" means (vLLM maps json_object likewise)


@dataclass(frozen=True)
class StructuredOutput:
    """``kind``: "json_schema" or "json_object"; ``schema_json``: the schema as compact JSON text
    (no spaces; key order kept, since llguidance emits properties in schema order), so equal
    schemas share one compiled grammar."""

    kind: str
    schema_json: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool | str) -> StructuredOutput:
        """From a schema (a dict, ``true``, or its JSON text). Raises :class:`RequestError`
        (``field`` "response_format") for text that is not JSON or a value that is not a schema."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise RequestError(
                    f"json_schema: invalid JSON ({e.msg} at column {e.colno}); expected a JSON Schema "
                    "object. Fix: send the schema as a JSON object.",
                    field="response_format",
                ) from None
        if not isinstance(schema, (dict, bool)):
            raise RequestError(
                f"json_schema = {schema!r:.80}: expected a JSON Schema (an object or true). "
                'Fix: send e.g. {"type": "object", "properties": {...}}.',
                field="response_format",
            )
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))  # key order kept: it is the output order

    @classmethod
    def json_object(cls) -> StructuredOutput:
        """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls("json_object", json.dumps(JSON_OBJECT_SCHEMA, sort_keys=True, separators=(",", ":")))

    @property
    def key(self) -> str:
        """sha256 hex of the canonical schema text: the compiled-grammar cache key."""
        return hashlib.sha256(self.schema_json.encode()).hexdigest()

    @property
    def schema(self) -> Any:
        return json.loads(self.schema_json)


__all__ = ["JSON_OBJECT_SCHEMA", "StructuredOutput"]
