"""From a request body's output constraint to the engine's `StructuredSpec`.

Accepted, at most one per request:

    response_format  {"type": "json_object"}
                     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                     {"type": "text"} (no constraint)
    guided_json      a JSON Schema (object or JSON text)     vLLM's extras
    guided_regex     a regular expression
    guided_choice    a list of strings
    guided_grammar   a Lark grammar (llguidance's dialect; may embed %json{...})
    structured_outputs  {"json" | "regex" | "choice" | "grammar" | "json_object": ...}

Only the shape is checked here; whether the grammar compiles (and within the
time limit) is the engine client's `prepare_structured`, before admission.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.structured.grammar import MAX_SCHEMA_DEPTH, json_depth
from engine.structured.spec import StructuredKind, StructuredSpec, StructuredSpecError
from gateway.errors import InvalidParameterError

# The body fields that carry a constraint, in the order they are looked at.
STRUCTURED_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
_STRUCTURED_OUTPUTS_KEYS: dict[str, StructuredKind] = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "lark",
    "json_object": "json_object",
}


def structured_spec(extra: Mapping[str, Any]) -> tuple[StructuredSpec, str] | None:
    """The constraint the body asks for and the field that asked; None for free text.

    Raises `InvalidParameterError` (400) naming the field for a malformed one, or
    when more than one field asks for a constraint.
    """
    found: list[tuple[StructuredSpec, str]] = []
    for name in STRUCTURED_FIELDS:
        value = extra.get(name)
        if value is None:
            continue
        spec = _parse(name, value)
        if spec is not None:
            found.append((spec, name))
    if len(found) > 1:
        names = ", ".join(name for _, name in found)
        raise InvalidParameterError(
            f"give one output constraint, not several ({names})", param=found[1][1]
        )
    return found[0] if found else None


def _parse(name: str, value: Any) -> StructuredSpec | None:
    try:
        if name == "response_format":
            return _response_format(value)
        if name == "guided_json":
            return StructuredSpec("json_schema", _schema_text(value, name))
        if name == "guided_regex":
            return StructuredSpec("regex", _text(value, name))
        if name == "guided_choice":
            return StructuredSpec("choice", _choices(value, name))
        if name == "guided_grammar":
            return StructuredSpec("lark", _text(value, name))
        return _structured_outputs(value)
    except StructuredSpecError as exc:
        raise InvalidParameterError(exc.message, param=name, code=exc.code) from None


def _response_format(value: Any) -> StructuredSpec | None:
    if not isinstance(value, dict):
        raise _bad("response_format", "must be an object with a type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json_object")
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise _bad(
                "response_format", "json_schema takes {'name': ..., 'schema': {...}, 'strict': ...}"
            )
        return StructuredSpec("json_schema", _schema_text(inner["schema"], "response_format"))
    raise _bad(
        "response_format",
        f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
    )


def _structured_outputs(value: Any) -> StructuredSpec:
    if not isinstance(value, dict):
        raise _bad("structured_outputs", "must be an object")
    given = [key for key in _STRUCTURED_OUTPUTS_KEYS if value.get(key) not in (None, False)]
    unknown = sorted(set(value) - set(_STRUCTURED_OUTPUTS_KEYS))
    if unknown:
        raise _bad("structured_outputs", f"unknown key {unknown[0]!r}")
    if len(given) != 1:
        keys = ", ".join(_STRUCTURED_OUTPUTS_KEYS)
        raise _bad("structured_outputs", f"takes exactly one of {keys}")
    key = given[0]
    kind = _STRUCTURED_OUTPUTS_KEYS[key]
    raw = value[key]
    if kind == "json_schema":
        return StructuredSpec(kind, _schema_text(raw, "structured_outputs"))
    if kind == "choice":
        return StructuredSpec(kind, _choices(raw, "structured_outputs"))
    if kind == "json_object":
        return StructuredSpec(kind)
    return StructuredSpec(kind, _text(raw, "structured_outputs"))


def _schema_text(schema: Any, name: str) -> str:
    try:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise _bad(name, "the JSON schema is not valid JSON") from None
        if json_depth(schema) > MAX_SCHEMA_DEPTH:
            raise RecursionError
        if not isinstance(schema, (dict, bool)):
            raise _bad(name, "the JSON schema must be an object")
        # Keys keep their order: the output lists properties in the schema's order.
        return json.dumps(schema, separators=(",", ":"))
    except RecursionError:  # json's own, past Python's limit, or ours
        raise _bad(
            name, f"the JSON schema is nested too deeply (more than {MAX_SCHEMA_DEPTH} levels)"
        ) from None


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(name, "must be a non-empty string")
    return value


def _choices(value: Any, name: str) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise _bad(name, "the choices must be a non-empty list of non-empty strings")
    return json.dumps(value)


def _bad(name: str, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"{name}: {why}", param=name, code="invalid_structured_output")
