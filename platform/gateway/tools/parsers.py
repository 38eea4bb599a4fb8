"""Tool calls out of generated text, one format per chat-template family.

    hermes       Qwen2.5, Hermes:  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    smollm2      SmolLM2:          <tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>
    llama3_json  Llama 3.x:        [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]
    mistral      Mistral:          [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
                 (and the newer     [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...})

The state machine that finds the calls is gateway.tools.streaming; its
`parse_tool_calls` runs it over a whole text, so a streamed reply always reassembles
to the non-streamed one. Output that does not parse as a call of a declared function
stays content: never an error.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

ParserName = Literal["hermes", "llama3_json", "smollm2", "mistral", "none"]
ParserSetting = Literal["auto", "hermes", "llama3_json", "smollm2", "mistral", "none"]
PARSERS: tuple[ParserName, ...] = ("hermes", "llama3_json", "smollm2", "mistral", "none")

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"


@dataclass(frozen=True)
class ParsedCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    """Generated text split into content (None when there is only calls) and calls."""

    content: str | None
    calls: tuple[ParsedCall, ...]


def detect_parser(chat_template: str | None, model_type: str | None = None) -> ParserName:
    """The family of a model's tool-call format, from its chat template (and model type).

    A template that renders tools says which format it taught; one that ignores tools
    (SmolLM2's) is told apart by its turn markers and the model type.
    """
    template = chat_template or ""
    if MISTRAL_CALLS in template:
        return "mistral"
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if PYTHON_TAG in template or "<|start_header_id|>" in template:
        return "llama3_json"
    if "<|im_start|>" in template:
        return "hermes" if model_type == "qwen2" else "smollm2"
    return "hermes" if template else "none"


def choose_parser(
    setting: ParserSetting, chat_template: str | None, model_type: str | None = None
) -> ParserName:
    """The operator's `tool_parser` setting, with `auto` resolved from the template."""
    if setting == "auto":
        return detect_parser(chat_template, model_type)
    return setting


def new_call_id() -> str:
    """A fresh call id in OpenAI's shape (`call_` and 24 letters and digits)."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _arguments_text(value: Any) -> str | None:
    """Arguments as compact-ish JSON text, or None when they are not an object."""
    if isinstance(value, str):  # some models emit the arguments as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def call_from_json(
    item: Any, *, arguments_key: str, names: frozenset[str] | None
) -> ParsedCall | None:
    """A `{"name": ..., arguments_key: {...}}` object as a call, or None."""
    if not isinstance(item, dict):
        return None
    name = item.get("name")
    if not isinstance(name, str) or (names is not None and name not in names):
        return None
    raw = item.get(arguments_key, item.get("arguments", item.get("parameters", {})))
    arguments = _arguments_text(raw)
    return None if arguments is None else ParsedCall(name, arguments)


def calls_from_block(
    text: str, *, arguments_key: str, names: frozenset[str] | None
) -> list[ParsedCall] | None:
    """Every call in one JSON text: an object, a list of them, or `;`-separated objects.

    None when any part is not a call (the whole block is then content).
    """
    decoder = json.JSONDecoder()
    items: list[Any] = []
    rest = text.strip()
    while rest:
        try:
            value, end = decoder.raw_decode(rest)
        except ValueError:
            return None
        items.extend(value if isinstance(value, list) else [value])
        rest = rest[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            return None
    if not text.strip():
        return None
    calls = [call_from_json(i, arguments_key=arguments_key, names=names) for i in items]
    # An empty list is SmolLM2's "no call is needed": a block of zero calls.
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def mistral_calls(text: str, *, names: frozenset[str] | None) -> list[ParsedCall] | None:
    """The calls after Mistral's [TOOL_CALLS]: a JSON list (or object) of calls, or the
    newer `name[ARGS]{...}` segments, each opened by [TOOL_CALLS]. None when any part
    is not a call of `names`."""
    body = text.strip()
    if body.startswith(("[", "{")):
        return calls_from_block(body, arguments_key="arguments", names=names)
    calls: list[ParsedCall] = []
    for segment in body.split(MISTRAL_CALLS):
        name, marker, raw = segment.partition(MISTRAL_ARGS)
        name = name.strip()
        if not marker or not name or (names is not None and name not in names):
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        arguments = _arguments_text(value)
        if arguments is None:
            return None
        calls.append(ParsedCall(name, arguments))
    return calls
