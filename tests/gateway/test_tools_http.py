"""Tool calling over HTTP: validation 400s, calls in OpenAI's shape, streaming, round trips.

Two module-scoped gateways: the tiny random model (real template, tokenizer, engine),
and the real engine over the fake fast model, scripted to answer with two calls
(tests/utils/scripted_tools.py), so that the reply's exact shape is checked without a
model that can call tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.utils.live_gateway import (
    LiveGateway,
    running,
    started_gateway,
)
from tests.utils.scripted_tools import (
    SCRIPTED,
    TIME_FUNCTION,
    WEATHER_FUNCTION,
    start_scripted_tools_gateway,
)

WEATHER = {"type": "function", "function": WEATHER_FUNCTION}
TIME = {"type": "function", "function": TIME_FUNCTION}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """The tiny random model behind a live gateway (SmolLM2's template: smollm2 format)."""
    with started_gateway(tmp_path_factory.mktemp("tools")) as gw:
        yield gw


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """The scripted engine answering every greedy request with SCRIPTED; hermes format."""
    with running(start_scripted_tools_gateway(tmp_path_factory.mktemp("tools-fake"))) as gw:
        yield gw


@pytest.fixture(scope="module")
def key(gateway: LiveGateway) -> str:
    return gateway.tenant("tools-acme")


@pytest.fixture(scope="module")
def scripted_key(scripted: LiveGateway) -> str:
    return scripted.tenant("tools-fake")


def _post(gw: LiveGateway, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/v1/chat/completions",
        json={"model": gw.model, "max_tokens": 4, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _tool(name: str, **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": "get_weather"}, "tools"),
        ({"tools": ["get_weather"]}, "tools"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
        ({"tools": [_tool("has space")]}, "tools"),
        ({"tools": [_tool("f", parameters={"type": "string"})]}, "tools"),
        ({"tools": [_tool("f", parameters=[1])]}, "tools"),
        ({"tools": [_tool("f"), _tool("f")]}, "tools"),
        ({"tools": [_tool(f"f{i}") for i in range(129)]}, "tools"),
        ({"tools": [_tool("f", description="x" * 70_000)]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions"),
        ({"functions": [WEATHER["function"]], "function_call": {"name": "nope"}}, "function_call"),
        (
            {"messages": [*ASK, {"role": "tool", "content": "sunny"}]},
            "messages",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "hi",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    }
                ]
            },
            "messages",
        ),
    ],
)
def test_invalid_tools_are_400s_in_openai_format(
    gateway: LiveGateway, key: str, body: dict[str, Any], param: str
) -> None:
    r = _post(gateway, key, {"messages": ASK, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param), error
    assert error["message"]


def test_completions_still_refuses_tools(gateway: LiveGateway, key: str) -> None:
    r = httpx.post(
        gateway.base_url + "/v1/completions",
        json={"model": gateway.model, "prompt": "hi", "max_tokens": 2, "tools": [WEATHER]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_scripted_calls_come_back_in_openai_shape(scripted: LiveGateway, scripted_key: str) -> None:
    out = scripted.client(scripted_key).chat.completions.create(
        model=scripted.model, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=400
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"utc": True}]
    assert all(c.type == "function" and c.id.startswith("call_") for c in calls)
    assert len({c.id for c in calls}) == 2


def test_scripted_stream_deltas_are_openai_shaped(scripted: LiveGateway, scripted_key: str) -> None:
    body = {
        "model": scripted.model,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "temperature": 0,
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        scripted.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {scripted_key}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0] for e in events[:-1]]
    calls = [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
    # First a delta with index, id, type, name and arguments "", then the arguments.
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert set(calls[1]) == {"index", "function"} and set(calls[1]["function"]) == {"arguments"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[2]["index"] == 1 and calls[2]["function"]["name"] == "get_time"
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    assert content == "Checking."
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_scripted_stream_reassembles_with_the_sdk(scripted: LiveGateway, scripted_key: str) -> None:
    client = scripted.client(scripted_key)
    args: dict[str, Any] = {
        "model": scripted.model,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "temperature": 0,
        "n": 2,
        "logprobs": True,
        "max_tokens": 400,
    }
    whole = client.chat.completions.create(**args)
    calls: dict[tuple[int, int], dict[str, str]] = {}
    content = ["", ""]
    tokens = [0, 0]
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                tokens[choice.index] += len(choice.logprobs.content)
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault((choice.index, call.index), {"name": "", "arguments": ""})
                entry["name"] += (call.function and call.function.name) or ""
                entry["arguments"] += (call.function and call.function.arguments) or ""
    for c in whole.choices:
        expected = [
            {"name": t.function.name, "arguments": t.function.arguments}
            for t in c.message.tool_calls or []
        ]
        assert len(expected) == 2
        assert [calls[(c.index, i)] for i in range(len(expected))] == expected
        assert content[c.index] == c.message.content
        # Every token's logprob is sent, also those of text held back as a call.
        assert c.logprobs is not None and c.logprobs.content is not None
        assert tokens[c.index] == len(c.logprobs.content) == len(SCRIPTED)


def test_scripted_legacy_functions_get_function_call(
    scripted: LiveGateway, scripted_key: str
) -> None:
    r = _post(
        scripted,
        scripted_key,
        {
            "messages": ASK,
            "functions": [WEATHER["function"], TIME["function"]],
            "temperature": 0,
            "max_tokens": 400,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["function_call"]["name"] == "get_weather"


def test_scripted_tool_choice_none_returns_the_text(
    scripted: LiveGateway, scripted_key: str
) -> None:
    out = scripted.client(scripted_key).chat.completions.create(
        model=scripted.model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=400,
    )
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].message.content == SCRIPTED
    assert out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_required_and_named_always_parse(gateway: LiveGateway, key: str, choice: Any) -> None:
    out = gateway.client(key).chat.completions.create(
        model=gateway.model,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        # One call each: a random model allowed a list keeps listing calls to max_tokens.
        parallel_tool_calls=False,
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=64,
    )
    for c in out.choices:
        assert c.finish_reason == "tool_calls", c.message.content
        calls = c.message.tool_calls or []
        assert calls, c.message.content
        for call in calls:
            arguments = json.loads(call.function.arguments)
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            if call.function.name == "get_weather":
                assert arguments in ({"city": "Paris"}, {"city": "Oslo"})
            else:
                assert set(arguments) == {"utc"}


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_stream_reassembles_to_non_stream_on_the_model(
    gateway: LiveGateway, key: str, choice: str
) -> None:
    client = gateway.client(key)
    args: dict[str, Any] = {
        "model": gateway.model,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": 24,
    }
    whole = client.chat.completions.create(**args).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += (call.function and call.function.name) or ""
            entry[1] += (call.function and call.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    expected = [[c.function.name, c.function.arguments] for c in whole.message.tool_calls or []]
    assert [calls[i] for i in sorted(calls)] == expected
    assert content == (whole.message.content or "")
    assert finish == whole.finish_reason


def test_tool_round_trip_with_the_sdk(gateway: LiveGateway, key: str) -> None:
    client = gateway.client(key)
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc123",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"sky": "clear"}'},
    ]
    out = client.chat.completions.create(
        model=gateway.model, messages=history, tools=[WEATHER], temperature=0, max_tokens=8
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    # The call and its result are in the prompt: it is longer than the question alone.
    alone = client.chat.completions.create(
        model=gateway.model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=1
    )
    assert out.usage is not None and alone.usage is not None
    assert out.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_tools_reach_the_prompt_unless_choice_is_none(gateway: LiveGateway, key: str) -> None:
    client = gateway.client(key)

    def prompt_tokens(**extra: Any) -> int:
        out = client.chat.completions.create(
            model=gateway.model, messages=ASK, max_tokens=1, temperature=0, **extra
        )
        assert out.usage is not None
        return out.usage.prompt_tokens

    plain = prompt_tokens()
    assert prompt_tokens(tools=[WEATHER], tool_choice="none") == plain
    assert prompt_tokens(tools=[WEATHER]) > plain + 50
    legacy = prompt_tokens(functions=[WEATHER["function"]])
    assert legacy == prompt_tokens(tools=[WEATHER])
