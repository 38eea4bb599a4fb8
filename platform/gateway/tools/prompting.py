"""Tools and tool turns into the messages a chat template renders.

A template that renders tools itself (Qwen2.5, Llama 3.1, Hermes) gets them through
`apply_chat_template(..., tools=...)` and the history in transformers' shape. One that
ignores them (SmolLM2's) gets the family's documented instructions in the system
message, and the history's calls and results written out in the family's format, so
that every template only ever sees string contents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.tools.parsers import MISTRAL_CALLS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParserName
from gateway.tools.schemas import FunctionTool, ToolRequest

_HERMES_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
# SmolLM2's own function-calling prompt (its model card), tools as one JSON list.
_SMOLLM2_INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of "
    "possible functions. Based on the question, you will need to make one or more "
    "function/tool calls to achieve the purpose. If none of the functions can be used, "
    "point it out and refuse to answer. If the given question lacks the parameters "
    "required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be "
    "included.\nThe example format is as follows. Please make sure the parameter type is "
    "correct. If no function call is needed, please make the tool calls an empty list "
    "'[]'.\n<tool_call>[\n"
    '{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": '
    '"value2"}}}},\n... (more tool calls as required)\n]</tool_call>'
)
# Llama 3.1's JSON tool-calling prompt (its template's custom-tools branch).
_LLAMA3_INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {{"name": function name, "parameters": dictionary of argument '
    "name and its value}}. Do not use variables.\n\n{tools}"
)
# Mistral's templates declare tools themselves ([AVAILABLE_TOOLS]); for one that does
# not, the same declaration and the [TOOL_CALLS] answer its models were trained on.
_MISTRAL_INSTRUCTIONS = (
    "[AVAILABLE_TOOLS]{tools}[/AVAILABLE_TOOLS]\n\n"
    'To call functions, answer [TOOL_CALLS][{{"name": <function-name>, '
    '"arguments": <args-json-object>}}, ...]'
)


@dataclass(frozen=True)
class RenderedChat:
    """Messages ready for the template, and the tools to hand it (None: not natively)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def template_renders_tools(chat_template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable itself."""
    return bool(chat_template) and "tools" in (chat_template or "")


def tools_instructions(tools: Sequence[FunctionTool], parser: ParserName) -> str:
    """The family's system-prompt text that declares `tools`."""
    defs = [t.openai_dict() for t in tools]
    if parser == "smollm2":
        return _SMOLLM2_INSTRUCTIONS.format(tools=json.dumps(defs, ensure_ascii=False))
    lines = "\n".join(json.dumps(d, ensure_ascii=False) for d in defs)
    if parser == "llama3_json":
        return _LLAMA3_INSTRUCTIONS.format(tools=lines)
    if parser == "mistral":
        return _MISTRAL_INSTRUCTIONS.format(tools=json.dumps(defs, ensure_ascii=False))
    return _HERMES_INSTRUCTIONS.format(tools=lines)


def _arguments(raw: Any) -> Any:
    """A history call's arguments as an object (they arrive as JSON text)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def render_calls(calls: Sequence[Mapping[str, Any]], parser: ParserName) -> str:
    """An assistant turn's calls as the model would have written them."""
    items = [
        {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
        for c in calls
    ]
    if parser == "smollm2":
        return TOOL_CALL_OPEN + json.dumps(items, ensure_ascii=False) + TOOL_CALL_CLOSE
    if parser == "mistral":
        return MISTRAL_CALLS + json.dumps(items, ensure_ascii=False)
    if parser == "llama3_json":
        return "; ".join(
            json.dumps({"name": i["name"], "parameters": i["arguments"]}, ensure_ascii=False)
            for i in items
        )
    return "\n".join(
        f"{TOOL_CALL_OPEN}\n{json.dumps(i, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}" for i in items
    )


def _native(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message in the shape transformers' tool-aware templates read."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _arguments(c["function"]["arguments"]),
                },
            }
            for c in message["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def _written_out(messages: Sequence[Mapping[str, Any]], parser: ParserName) -> list[dict[str, Any]]:
    """The history with calls and results as plain text turns of the family's format."""
    out: list[dict[str, Any]] = []
    previous_was_result = False
    for m in messages:
        content = m.get("content") or ""
        is_result = m["role"] == "tool" and parser != "llama3_json"
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = render_calls(m["tool_calls"], parser)
            text = f"{content}\n{calls}" if content else calls
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool" and parser == "llama3_json":
            out.append({"role": "ipython", "content": content})
        elif is_result:
            # Hermes and SmolLM2 read results as user turns; consecutive ones share a turn.
            response = f"<tool_response>\n{content}\n</tool_response>"
            if previous_was_result:
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
        else:
            out.append({"role": m["role"], "content": content})
        previous_was_result = is_result
    return out


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` appended to the leading system message, or a new one in front."""
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}" if first["content"] else text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: ToolRequest,
    parser: ParserName,
    *,
    chat_template: str | None,
) -> RenderedChat:
    """The template's input for `messages` (OpenAI dicts: role, content, tool_calls,
    tool_call_id, name) with `tools` declared when active."""
    if template_renders_tools(chat_template):
        native = [_native(m) for m in messages]
        defs = [t.openai_dict() for t in tools.tools] if tools.active else None
        return RenderedChat(native, defs)
    written = _written_out(messages, parser)
    if tools.active:
        written = _with_system(written, tools_instructions(tools.tools, parser))
    return RenderedChat(written, None)
