"""The grammar that holds generation to a valid tool call (required, named or strict).

One llguidance Lark grammar per request, in the family's call format, each call's
`name` a constant and its `arguments` the function's own JSON Schema:

    start: "<tool_call>\\n" call "\\n</tool_call>"                       (hermes)
    call: call_0 | call_1
    call_0: %json {"type": "object", "properties": {"name": {"const": "f"},
                   "arguments": <f's parameters>}, "required": [...]}

With `tool_choice="auto"` and a strict tool the model may still answer in text, as
long as that text does not start like a call; an output that starts with a call is
held to the strict tools' schemas (a call opened later in a text answer is not).
The engine enforces the grammar (SamplingParams.structured); this module only writes
and checks it.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from engine.structured.spec import StructuredSpec, StructuredSpecError
from gateway.errors import InvalidParameterError
from gateway.tools.parsers import MISTRAL_CALLS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParserName
from gateway.tools.schemas import FunctionTool, ToolRequest


def _lit(text: str) -> str:
    """A Lark string literal (JSON escaping is a subset Lark reads)."""
    return json.dumps(text)


def call_schema(tool: FunctionTool, arguments_key: str, *, loose: bool = False) -> dict[str, Any]:
    """The JSON Schema of one call object of `tool` (`loose`: any arguments object)."""
    arguments = {"type": "object"} if loose else dict(tool.parameters) or {"type": "object"}
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            arguments_key: arguments,
        },
        "required": ["name", arguments_key],
        "additionalProperties": False,
        # json.dumps' separators, as models write calls; no runs of free whitespace
        # (a weak model held to a schema could otherwise pad a call until max_tokens).
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }


def _calls_rule(
    tools: tuple[FunctionTool, ...], arguments_key: str, *, only_strict: bool
) -> list[str]:
    rules = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        loose = only_strict and not tool.strict
        schema = json.dumps(call_schema(tool, arguments_key, loose=loose), ensure_ascii=False)
        rules.append(f"call_{i}: %json {schema}")
    return rules


def _calls_start(parser: ParserName, parallel: bool) -> str:
    """The rule `calls`: one or more calls in the family's format."""
    if parser == "smollm2":
        more = ' (", " call)*' if parallel else ""
        return f"calls: {_lit(TOOL_CALL_OPEN + '[')} call{more} {_lit(']' + TOOL_CALL_CLOSE)}"
    if parser == "llama3_json":
        more = ' ("; " call)*' if parallel else ""
        return f"calls: call{more}"
    if parser == "mistral":
        more = ' (", " call)*' if parallel else ""
        return f"calls: {_lit(MISTRAL_CALLS + '[')} call{more} {_lit(']')}"
    block = f"{_lit(TOOL_CALL_OPEN + chr(10))} call {_lit(chr(10) + TOOL_CALL_CLOSE)}"
    more = f' ("\\n" {block})*' if parallel else ""
    return f"calls: {block}{more}"


def _free_text(parser: ParserName) -> str:
    """Text whose first non-space character cannot open a call."""
    first = {"llama3_json": "\\{", "mistral": "\\["}.get(parser, TOOL_CALL_OPEN[0])
    return f"TEXT: /\\s*[^{first}\\s][\\s\\S]*/"


def tool_call_grammar(tools: ToolRequest, parser: ParserName) -> StructuredSpec | None:
    """The constraint for a request, or None when generation is free.

    required / named: the whole output is the call(s); auto with a strict tool: calls or
    text that opens none. Raises a 400 when a schema is one llguidance cannot compile.
    """
    if not tools.constrained or parser == "none":
        return None
    offered = tools.offered
    key = "parameters" if parser == "llama3_json" else "arguments"
    parallel = tools.parallel and tools.mode != "named"
    rules = ["start: calls" if tools.mode != "auto" else "start: calls | TEXT"]
    rules.append(_calls_start(parser, parallel))
    # With auto, only strict tools are held to their schemas; the others take any object.
    rules.extend(_calls_rule(offered, key, only_strict=tools.mode == "auto"))
    if tools.mode == "auto":
        rules.append(_free_text(parser))
    grammar = "\n".join(rules)
    error = validate(grammar)
    if error:
        raise InvalidParameterError(
            f"the tools' parameter schemas cannot be enforced: {error}",
            param="tools",
            code="invalid_tools",
        )
    try:
        return StructuredSpec(kind="lark", value=grammar)
    except StructuredSpecError as exc:
        raise InvalidParameterError(exc.message, param="tools", code="invalid_tools") from None


def validate(grammar: str, tokenizer: Any = None) -> str:
    """llguidance's complaint about a Lark grammar ("" when it compiles)."""
    try:
        compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        return str(llguidance.LLMatcher.validate_grammar(compiled, tokenizer) or "")
    except Exception as exc:  # llguidance raises plain ValueErrors/RuntimeErrors
        return str(exc)
