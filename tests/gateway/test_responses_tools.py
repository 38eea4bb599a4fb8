"""Function tools on /v1/responses with the openai SDK: calls as `function_call` items,
their typed stream events, `function_call_output` round trips, and the 400s.

Two module-scoped gateways: the real engine over the fake fast model, scripted to answer
with two calls (hermes format; tests/utils/scripted_tools.py), so the exact shapes are
checked, and the tiny random model, whose
`tool_choice="required"` output is held to a valid call by constrained decoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.utils.live_gateway import (
    LiveGateway,
    running,
    started_gateway,
)
from tests.utils.scripted_tools import TIME_FUNCTION, WEATHER_FUNCTION, start_scripted_tools_gateway

WEATHER = {"type": "function", **WEATHER_FUNCTION}
TIME = {"type": "function", **TIME_FUNCTION}
EXPECTED = [("get_weather", {"city": "Paris"}), ("get_time", {"utc": True})]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    with running(
        start_scripted_tools_gateway(tmp_path_factory.mktemp("responses-tools-fake"))
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    with started_gateway(tmp_path_factory.mktemp("responses-tools-tiny")) as gw:
        yield gw


def _client(gw: LiveGateway, tenant: str) -> openai.OpenAI:
    return gw.client(gw.tenant(tenant))


def _calls(output: list[Any]) -> list[tuple[str, Any]]:
    return [(i.name, json.loads(i.arguments)) for i in output if i.type == "function_call"]


def test_calls_come_back_as_function_call_items(scripted: LiveGateway) -> None:
    client = _client(scripted, "rt-acme")
    out = client.responses.create(
        model=scripted.model,
        input="Weather in Paris, and the time?",
        tools=[WEATHER, TIME],
        temperature=0,
    )
    assert out.status == "completed"
    assert [i.type for i in out.output] == ["message", "function_call", "function_call"]
    assert out.output_text == "Checking."
    assert _calls(out.output) == EXPECTED
    call_ids = [i.call_id for i in out.output if i.type == "function_call"]
    assert len(set(call_ids)) == 2 and all(c.startswith("call_") for c in call_ids)
    assert [t.name for t in out.tools] == ["get_weather", "get_time"]  # echoed as given
    assert out.usage is not None and out.usage.output_tokens > 0
    # The stored response holds the calls too (GET returns what POST returned).
    assert client.responses.retrieve(out.id).output == out.output


def test_streamed_events_reassemble_to_the_same_calls(scripted: LiveGateway) -> None:
    client = _client(scripted, "rt-stream")
    with client.responses.stream(
        model=scripted.model,
        input="Weather in Paris, and the time?",
        tools=[WEATHER, TIME],
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.count("response.function_call_arguments.done") == 2
    deltas: dict[int, str] = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            deltas[e.output_index] = deltas.get(e.output_index, "") + e.delta
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done_items] == ["message", "function_call", "function_call"]
    assert [json.loads(d) for d in deltas.values()] == [a for _, a in EXPECTED]
    assert _calls(final.output) == EXPECTED and final.output_text == "Checking."
    assert [i.call_id for i in final.output[1:]] == [i.call_id for i in done_items[1:]]


def test_a_full_round_trip_with_function_call_output(scripted: LiveGateway) -> None:
    client = _client(scripted, "rt-round")
    tools: Any = [WEATHER, TIME]
    first = client.responses.create(
        model=scripted.model, input="Paris?", tools=tools, temperature=0
    )
    outputs = [
        {"type": "function_call_output", "call_id": i.call_id, "output": '{"temp_c": 11}'}
        for i in first.output
        if i.type == "function_call"
    ]
    chained = client.responses.create(
        model=scripted.model,
        previous_response_id=first.id,
        input=outputs,
        tools=tools,
        temperature=0,
    )
    # The same conversation sent whole, without the store: the prompts are the same size.
    replayed = client.responses.create(
        model=scripted.model,
        input=[
            {"role": "user", "content": "Paris?"},
            *[i.model_dump(exclude_none=True) for i in first.output],
            *outputs,
        ],
        tools=tools,
        store=False,
        temperature=0,
    )
    assert chained.usage is not None and replayed.usage is not None and first.usage is not None
    assert chained.usage.input_tokens == replayed.usage.input_tokens > first.usage.input_tokens


def test_required_always_gives_a_call_on_the_model(tiny: LiveGateway) -> None:
    client = _client(tiny, "rt-tiny")
    for seed in range(3):
        out = client.responses.create(
            model=tiny.model,
            input="What is the weather in Oslo?",
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            max_output_tokens=64,
            metadata={"seed": str(seed)},
        )
        calls = _calls(out.output)
        assert out.status == "completed" and len(calls) == 1, out.output
        name, arguments = calls[0]
        assert (name, set(arguments)) in (("get_weather", {"city"}), ("get_time", {"utc"}))


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "tools of type web_search"),
        ({"tools": [{"type": "function"}]}, "tools", "name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input", "call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c1"}]}, "input", "output"),
        ({"input": [{"type": "function_call_output", "call_id": "c" * 300, "output": "x"}]}, "input", "longer"),
    ],
)  # fmt: skip
def test_bad_tool_input_is_a_400(
    scripted: LiveGateway, bad_client: openai.OpenAI, body: dict[str, Any], param: str, words: str
) -> None:
    args: dict[str, Any] = {"model": scripted.model, "input": "hi", **body}
    with pytest.raises(openai.BadRequestError) as refused:
        bad_client.responses.create(**args)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"].startswith(param), error
    assert words in error["message"], error


@pytest.fixture(scope="module")
def bad_client(scripted: LiveGateway) -> openai.OpenAI:
    return _client(scripted, "rt-bad")
