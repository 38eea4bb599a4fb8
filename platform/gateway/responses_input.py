"""A Responses `input` as chat-template turns, and the options this server refuses.

`input` is a string (one user message) or a list of items. Each item is turned
into turns by the converter registered for its `type` in `ITEM_CONVERTERS`; an
item without a `type` but with a `role` is a message (the SDK's EasyInputMessage).
A type without a converter is a 400 `unsupported` naming it. A `function_call`
item (a call the model made earlier) joins the assistant turn before it, as that
turn's `tool_calls`; a `function_call_output` item is the `tool` turn answering it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.errors import InvalidParameterError
from gateway.params import vet_extra_fields
from gateway.response_store import Turn
from gateway.schemas.responses import ResponseCreateRequest

# Developer messages are the system prompt of OpenAI's newer models; chat templates
# know "system" (some refuse any role they do not know).
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = frozenset({"input_text", "output_text"})
# Chat-completions fields with a Responses spelling: refused, not silently dropped.
_CHAT_ONLY = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "n": None,
    "stop": None,
    "seed": None,
    "logit_bias": None,
    "logprobs": None,
    "top_logprobs": None,
    "presence_penalty": None,
    "frequency_penalty": None,
    "response_format": "text.format",
}
# Longest call id or function name taken in an input item.
MAX_ID_CHARS = 256
# Responses fields that change the output and that this server does not serve.
_UNSUPPORTED = ("conversation", "prompt", "max_tool_calls")


def unsupported(what: str, param: str) -> InvalidParameterError:
    """The 400 for a feature this server does not serve."""
    return InvalidParameterError(
        f"{what} is not supported by this server", param=param, code="unsupported"
    )


def _message(item: Mapping[str, Any], where: str) -> list[Turn]:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidParameterError(
            f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param="input"
        )
    content = item.get("content")
    if isinstance(content, str):
        return [{"role": ROLES[role], "content": content}]
    if not isinstance(content, list):
        raise InvalidParameterError(
            f"{where}.content must be a string or a list of content parts", param="input"
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise InvalidParameterError(
                f"{where}.content[{j}] must be an object with a type", param="input"
            )
        if kind not in TEXT_PARTS:
            raise unsupported(f"content part type {kind!r} ({where}.content[{j}])", "input")
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidParameterError(
                f"{where}.content[{j}].text must be a string", param="input"
            )
        texts.append(text)
    return [{"role": ROLES[role], "content": "".join(texts)}]


def _text_field(item: Mapping[str, Any], name: str, where: str, *, limit: int | None) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value and limit is not None:
        raise InvalidParameterError(f"{where}.{name} must be a non-empty string", param="input")
    if limit is not None and len(value) > limit:
        raise InvalidParameterError(
            f"{where}.{name} is longer than {limit} characters", param="input"
        )
    return value


def _function_call(item: Mapping[str, Any], where: str) -> list[Turn]:
    """An earlier call of the model's: a tool call of an assistant turn."""
    call = {
        "id": _text_field(item, "call_id", where, limit=MAX_ID_CHARS),
        "type": "function",
        "function": {
            "name": _text_field(item, "name", where, limit=MAX_ID_CHARS),
            "arguments": _text_field(item, "arguments", where, limit=None),
        },
    }
    return [{"role": "assistant", "content": None, "tool_calls": [call]}]


def _function_call_output(item: Mapping[str, Any], where: str) -> list[Turn]:
    """What the caller's function returned: a tool turn answering one call."""
    return [
        {
            "role": "tool",
            "tool_call_id": _text_field(item, "call_id", where, limit=MAX_ID_CHARS),
            "content": _text_field(item, "output", where, limit=None),
        }
    ]


# item type -> its turns; the one place new input item types are added.
ITEM_CONVERTERS: dict[str, Callable[[Mapping[str, Any], str], list[Turn]]] = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
}


def _join(turns: list[Turn], new: list[Turn]) -> None:
    """Appends `new`; calls join the assistant turn just before them (one message)."""
    for turn in new:
        last = turns[-1] if turns else None
        if turn.get("tool_calls") and last is not None and last.get("role") == "assistant":
            calls = [*(last.get("tool_calls") or []), *turn["tool_calls"]]
            turns[-1] = {**last, "tool_calls": calls}
            continue
        turns.append(turn)


def input_turns(raw: str | Sequence[Mapping[str, Any]]) -> list[Turn]:
    """The turns of a request's `input`; a 400 naming the first item it refuses."""
    if isinstance(raw, str):
        if not raw:
            raise InvalidParameterError("input must not be empty", param="input")
        return [{"role": "user", "content": raw}]
    if not raw:
        raise InvalidParameterError("input must not be empty", param="input")
    turns: list[Turn] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if not isinstance(kind, str):
            raise InvalidParameterError(f"{where} has no type", param="input")
        convert = ITEM_CONVERTERS.get(kind)
        if convert is None:
            raise unsupported(f"input item type {kind!r} ({where})", "input")
        _join(turns, convert(item, where))
    return turns


def with_instructions(instructions: str | None, turns: Sequence[Turn]) -> list[Turn]:
    """`turns` behind the request's instructions (never stored: OpenAI does not carry them)."""
    head: list[Turn] = [{"role": "system", "content": instructions}] if instructions else []
    return [*head, *turns]


def _type_name(tool: Any) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else None
    return kind[:64] if isinstance(kind, str) else "?"


def vet_response_request(body: ResponseCreateRequest) -> None:
    """400 `unsupported` for any option that would change the output and is not served."""
    extra = body.extra_fields()
    for name, spelling in _CHAT_ONLY.items():
        if extra.get(name) is not None:
            hint = f"; use {spelling}" if spelling else ""
            raise InvalidParameterError(
                f"{name!r} is not a Responses API parameter{hint}", param=name, code="unsupported"
            )
    for name in _UNSUPPORTED:
        if extra.get(name) is not None:
            raise unsupported(f"parameter {name!r}", name)
    vet_extra_fields(extra)
    # Function tools are served (gateway.tools); built-in tools (web search, files, ...) not.
    builtin = sorted({_type_name(t) for t in body.tools or () if _type_name(t) != "function"})
    if builtin:
        raise unsupported(f"tools of type {', '.join(builtin)}", "tools")
    if body.text is not None:
        fmt = body.text.get("format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise unsupported("text.format other than {'type': 'text'}", "text")
    if body.reasoning is not None:
        raise unsupported("reasoning", "reasoning")
    if body.include:
        raise unsupported("include", "include")
    if body.truncation == "auto":
        raise unsupported("truncation 'auto'", "truncation")
    if body.background:
        raise unsupported("background", "background")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise InvalidParameterError(
            "max_output_tokens must be at least 1", param="max_output_tokens"
        )
