"""From a `StructuredSpec` to the grammar text llguidance compiles.

Pure and cheap (no tokenizer, no compile): the compile and its limits are
engine.structured.compiler's.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from engine.structured.lark_check import never_finishing_rules
from engine.structured.spec import StructuredSpec, StructuredSpecError

# JSON is emitted compactly, as `json.dumps` writes it: with whitespace left free, a
# model may pad forever, and every run of spaces is a token the client pays for.
# A schema may still ask for free whitespace through its own "x-guidance" options.
_JSON_DEFAULTS: Any = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# `json_object`: any JSON object (OpenAI's JSON mode).
_ANY_OBJECT = '{"type": "object"}'
MAX_CHOICES = 256
# The deepest JSON Schema taken, in nested objects and arrays: llguidance's JSON parser
# stops at 128 levels (the schema travels inside a grammar three levels deep), and a
# deeper one is refused here with a message that says so.
MAX_SCHEMA_DEPTH = 100


def to_grammar(spec: StructuredSpec) -> str:
    """The llguidance grammar for `spec`; raises `StructuredSpecError` for malformed input.

    Whether the grammar compiles (unsupported schema keywords, bad regexes) is only
    known when it is compiled against a tokenizer.
    """
    if spec.kind == "json_schema":
        return _json_grammar(spec.value)
    if spec.kind == "json_object":
        return _json_grammar(_ANY_OBJECT)
    if spec.kind == "regex":
        if not spec.value:
            raise StructuredSpecError("the regular expression is empty", param="guided_regex")
        return str(llguidance.LLMatcher.grammar_from_regex(spec.value))
    if spec.kind == "choice":
        return _choice_grammar(spec.value)
    if not spec.value.strip():
        raise StructuredSpecError("the grammar is empty", param="guided_grammar")
    _check_finite(spec.value)
    return str(llguidance.LLMatcher.grammar_from_lark(spec.value))


def _check_finite(lark: str) -> None:
    """Refuses a grammar with a reachable rule that can never finish (`start: "a" start`):
    a request under it could only run until a limit ends it."""
    stuck = never_finishing_rules(lark)
    if stuck:
        names = ", ".join(repr(name) for name in stuck[:3])
        what = f"rule {names}" if len(stuck) == 1 else f"rules {names}"
        raise StructuredSpecError(
            f"the grammar can never finish: every alternative of {what} recurses "
            "without end (give each recursive rule an alternative that ends)",
            param="guided_grammar",
        )


def _json_grammar(schema: str) -> str:
    too_deep = False
    try:
        parsed = json.loads(schema)
    except RecursionError:
        parsed, too_deep = None, True  # deeper than Python's limit: over ours too
    except ValueError:
        raise StructuredSpecError(
            "the JSON schema is not valid JSON", param="response_format"
        ) from None
    if too_deep or json_depth(parsed) > MAX_SCHEMA_DEPTH:
        raise StructuredSpecError(
            f"the JSON schema is nested too deeply (more than {MAX_SCHEMA_DEPTH} levels)",
            param="response_format",
        )
    if not isinstance(parsed, (dict, bool)):
        raise StructuredSpecError(
            "the JSON schema must be an object (or a boolean)", param="response_format"
        )
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS))
    except ValueError as exc:
        raise StructuredSpecError(
            f"the JSON schema was refused: {exc}", param="response_format"
        ) from None


def json_depth(value: Any) -> int:
    """How deep `value`'s objects and arrays nest (0 for a scalar); iterative, so any
    depth is measured without recursion."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def _choice_grammar(value: str) -> str:
    """A Lark alternation of the literal choices (JSON string literals are Lark's too)."""
    try:
        choices = json.loads(value)
    except ValueError:
        choices = None
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise StructuredSpecError(
            "guided_choice takes a non-empty list of non-empty strings", param="guided_choice"
        )
    if len(choices) > MAX_CHOICES:
        raise StructuredSpecError(
            f"guided_choice takes at most {MAX_CHOICES} choices, got {len(choices)}",
            param="guided_choice",
        )
    alternatives = " | ".join(json.dumps(c, ensure_ascii=True) for c in dict.fromkeys(choices))
    return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
