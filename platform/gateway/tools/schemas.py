"""Tool definitions and tool choice, validated once into a frozen `ToolRequest`.

OpenAI's request shape (`tools`, `tool_choice`, `parallel_tool_calls`) and the legacy
one (`functions`, `function_call`) both end here; every mistake is a 400 naming the
parameter, never a 5xx.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidParameterError

# OpenAI's own limits: at most 128 tools, names of 1-64 letters, digits, '_' or '-'.
MAX_TOOLS = 128
MAX_TOOLS_BYTES = 64 * 1024  # the definitions as JSON; they are rendered into the prompt
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

ChoiceMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; `parameters` is its arguments' JSON Schema."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool = False

    def openai_dict(self) -> dict[str, Any]:
        """The tool as OpenAI spells it (`{"type": "function", "function": {...}}`)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tool calling: the tools, how to choose, how many calls."""

    tools: tuple[FunctionTool, ...]
    mode: ChoiceMode
    named: str | None = None  # the function `tool_choice` names, with mode "named"
    parallel: bool = True
    legacy: bool = False  # asked with `functions`: answered with `function_call`

    @property
    def active(self) -> bool:
        """Whether tools are rendered into the prompt and calls parsed from the output."""
        return bool(self.tools) and self.mode != "none"

    @property
    def names(self) -> frozenset[str]:
        """The declared function names."""
        return frozenset(t.name for t in self.tools)

    @property
    def offered(self) -> tuple[FunctionTool, ...]:
        """The tools the model may call: only the named one with a named choice."""
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools

    @property
    def constrained(self) -> bool:
        """Whether generation must be held to a valid call (required, named, strict)."""
        if not self.active:
            return False
        return self.mode in ("required", "named") or any(t.strict for t in self.tools)


NO_TOOLS = ToolRequest(tools=(), mode="none")


def _bad(message: str, param: str) -> InvalidParameterError:
    return InvalidParameterError(message, param=param, code="invalid_tools")


def _function(raw: Any, param: str) -> FunctionTool:
    """A function definition (`{"name", "description"?, "parameters"?, "strict"?}`)."""
    if not isinstance(raw, dict):
        raise _bad(f"{param} must be an object", param)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            f"{param}.name must be 1-64 letters, digits, underscores or dashes, got {name!r}",
            f"{param}.name",
        )
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{param}.description must be a string", f"{param}.description")
    parameters = raw.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise _bad(f"{param}.parameters must be a JSON Schema object", f"{param}.parameters")
    if parameters.get("type", "object") != "object":
        raise _bad(
            f"{param}.parameters must describe an object (type 'object')", f"{param}.parameters"
        )
    strict = raw.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise _bad(f"{param}.strict must be a boolean", f"{param}.strict")
    return FunctionTool(name, description, parameters, bool(strict))


def _tools(raw: Any, field: str, *, flat: bool = False) -> tuple[FunctionTool, ...]:
    """`tools` (or the legacy `functions`, a list of bare function definitions).

    `flat`: the Responses API's shape, `{"type": "function", "name": ..., ...}`.
    """
    if not isinstance(raw, list):
        raise _bad(f"{field} must be a list", field)
    if len(raw) > MAX_TOOLS:
        raise _bad(f"{field} takes at most {MAX_TOOLS} functions, got {len(raw)}", field)
    if len(json.dumps(raw, ensure_ascii=False)) > MAX_TOOLS_BYTES:
        raise _bad(f"the {field} definitions exceed {MAX_TOOLS_BYTES} characters", field)
    out: list[FunctionTool] = []
    for i, tool in enumerate(raw):
        if field == "functions":
            out.append(_function(tool, f"functions[{i}]"))
            continue
        if not isinstance(tool, dict) or tool.get("type") != "function":
            where = f"tools[{i}]"
            raise _bad(f"{where} must be {{'type': 'function', 'function': {{...}}}}", where)
        if flat:
            out.append(_function(tool, f"tools[{i}]"))
        else:
            out.append(_function(tool.get("function"), f"tools[{i}].function"))
    names = [t.name for t in out]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _bad(f"{field} has two functions named {duplicate!r}", field)
    return tuple(out)


def _choice(raw: Any, names: frozenset[str], param: str) -> tuple[ChoiceMode, str | None]:
    if raw is None:
        return "auto", None
    if raw in ("none", "auto", "required"):
        mode: ChoiceMode = raw
        return mode, None
    name: Any = None
    if isinstance(raw, dict):
        # `{"type": "function", "function": {"name": ...}}`; legacy `{"name": ...}`;
        # the Responses API's `{"type": "function", "name": ...}`.
        function = raw.get("function", raw) if raw.get("type") == "function" else raw
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidParameterError(
            f"{param} must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param=param,
        )
    if name not in names:
        raise InvalidParameterError(
            f"{param} names function {name!r}, which is not among the tools", param=param
        )
    return "named", name


def resolve_tools(
    *,
    tools: Any = None,
    tool_choice: Any = None,
    parallel_tool_calls: Any = None,
    functions: Any = None,
    function_call: Any = None,
    flat: bool = False,
) -> ToolRequest:
    """The request's tool calling, validated; legacy `functions` map onto tools.

    `flat` takes `tools` in the Responses API's shape (no `function` wrapper).
    """
    if functions is not None and tools is not None:
        raise InvalidParameterError("give tools or functions, not both", param="functions")
    if function_call is not None and tool_choice is not None:
        raise InvalidParameterError(
            "give tool_choice or function_call, not both", param="function_call"
        )
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidParameterError(
            "parallel_tool_calls must be a boolean", param="parallel_tool_calls"
        )
    if functions is not None:
        parsed = _tools(functions, "functions")
    else:
        parsed = _tools(tools, "tools", flat=flat) if tools is not None else ()
    choice_param = "function_call" if function_call is not None else "tool_choice"
    raw_choice = function_call if function_call is not None else tool_choice
    if not parsed:
        if raw_choice not in (None, "none", "auto"):
            raise InvalidParameterError(f"{choice_param} needs tools", param=choice_param)
        return NO_TOOLS
    mode, named = _choice(raw_choice, frozenset(t.name for t in parsed), choice_param)
    # The legacy API makes exactly one call per message.
    parallel = functions is None and parallel_tool_calls is not False
    return ToolRequest(
        tools=parsed, mode=mode, named=named, parallel=parallel, legacy=functions is not None
    )
