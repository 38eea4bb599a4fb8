"""resolve_tools: what a request's tool fields become, and the 400s they can raise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidParameterError
from gateway.schemas.chat import ChatCompletionRequest
from gateway.tools import render_chat, resolve_tools, tool_call_grammar
from gateway.tools.chat_reply import assistant_reply, chat_tooling, finish_reason

WEATHER_FN: dict[str, Any] = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER = {"type": "function", "function": WEATHER_FN}


def test_defaults_auto_and_parallel() -> None:
    req = resolve_tools(tools=[WEATHER])
    assert req.mode == "auto" and req.parallel and req.active and not req.constrained
    assert req.names == frozenset({"get_weather"})
    assert req.tools[0].openai_dict() == WEATHER


def test_no_tools_is_inactive_whatever_the_choice() -> None:
    for choice in (None, "none", "auto"):
        assert not resolve_tools(tools=[], tool_choice=choice).active
    assert not resolve_tools(tools=[WEATHER], tool_choice="none").active


def test_named_choice_offers_only_that_tool() -> None:
    other = {"type": "function", "function": {"name": "other"}}
    choice = {"type": "function", "function": {"name": "other"}}
    req = resolve_tools(tools=[WEATHER, other], tool_choice=choice, parallel_tool_calls=False)
    assert req.mode == "named" and req.named == "other" and not req.parallel
    assert [t.name for t in req.offered] == ["other"] and req.constrained
    # A missing parameters schema means "no arguments".
    assert req.offered[0].parameters == {"type": "object", "properties": {}}


def test_strict_tool_is_constrained_under_auto() -> None:
    req = resolve_tools(tools=[{"type": "function", "function": {**WEATHER_FN, "strict": True}}])
    assert req.mode == "auto" and req.constrained


def test_legacy_functions_map_to_one_call_tools() -> None:
    req = resolve_tools(functions=[WEATHER_FN], function_call={"name": "get_weather"})
    assert req.legacy and not req.parallel and req.mode == "named"
    assert req.tools == resolve_tools(tools=[WEATHER]).tools


def test_responses_api_shape_with_flat() -> None:
    flat = {"type": "function", **WEATHER_FN, "strict": True}
    req = resolve_tools(
        tools=[flat], tool_choice={"type": "function", "name": "get_weather"}, flat=True
    )
    assert req.mode == "named" and req.tools[0].strict and req.tools[0].name == "get_weather"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "y"}}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
            "tools[0]",
        ),
        ({"functions": "f"}, "functions"),
        ({"functions": [{"name": "f"}, {"name": "f"}]}, "functions"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice"),
        ({"function_call": "auto", "tool_choice": "auto"}, "function_call"),
    ],
)
def test_bad_fields_name_their_parameter(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        resolve_tools(**kwargs)
    assert caught.value.param is not None and caught.value.param.startswith(param)


def _body(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_parser_setting_none_refuses_tools_but_not_plain_chat() -> None:
    with pytest.raises(InvalidParameterError) as caught:
        chat_tooling(_body(tools=[WEATHER]), setting="none", chat_template="<|im_start|>")
    assert caught.value.param == "tools" and caught.value.code == "unsupported"
    assert not chat_tooling(_body(), setting="none", chat_template=None).active
    # tool_choice "none" asks for no calling: allowed even where calling is off.
    assert not chat_tooling(
        _body(tools=[WEATHER], tool_choice="none"), setting="none", chat_template=None
    ).active


def test_auto_setting_reads_the_template() -> None:
    smol = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"
    assert chat_tooling(_body(tools=[WEATHER]), setting="auto", chat_template=smol).parser == (
        "smollm2"
    )
    assert chat_tooling(_body(tools=[WEATHER]), setting="hermes", chat_template=smol).parser == (
        "hermes"
    )


def test_reply_and_finish_reason() -> None:
    tooling = chat_tooling(_body(tools=[WEATHER]), setting="hermes", chat_template=None)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    message, calls = assistant_reply(text, tooling)
    assert calls == 1 and message.content is None and message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert finish_reason("stop", calls, tooling) == "tool_calls"
    assert finish_reason("length", calls, tooling) == "length"
    assert finish_reason("stop", 0, tooling) == "stop"
    dumped = message.model_dump()
    assert "function_call" not in dumped and dumped["content"] is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
NAMES = st.sampled_from(["f", "g", "bad name", ""])
FUNCTION = st.fixed_dictionaries(
    {"name": NAMES},
    optional={
        "description": JSON,
        "parameters": JSON | st.just({"type": "object"}),
        "strict": JSON,
    },
)
TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}) | JSON
CHOICE = (
    st.sampled_from(["none", "auto", "required"])
    | st.builds(lambda n: {"type": "function", "function": {"name": n}}, NAMES)
    | JSON
)


@settings(max_examples=300, deadline=None)
@given(
    tools=st.none() | st.lists(TOOL, max_size=3) | JSON,
    choice=st.none() | CHOICE,
    parallel=st.none() | JSON,
    parser=st.sampled_from(["hermes", "smollm2", "llama3_json"]),
)
def test_any_json_is_resolved_or_a_400(tools: Any, choice: Any, parallel: Any, parser: Any) -> None:
    try:
        req = resolve_tools(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
        render_chat([{"role": "user", "content": "hi"}], req, parser, chat_template=None)
        tool_call_grammar(req, parser)
    except InvalidParameterError as exc:
        assert exc.param and exc.message
