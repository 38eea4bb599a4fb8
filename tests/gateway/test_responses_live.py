"""POST/GET/DELETE /v1/responses with the OpenAI SDK against one live gateway (tiny model).

Metered, limited and refused like chat: one usage record per response, 429 past the
tenant's limits, a 400 naming each bad field, and stored responses scoped to a tenant.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.utils.live_gateway import LiveGateway, started_gateway
from tests.utils.openai_http import post_json

STREAM_TYPES = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING_TYPES = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway for the module; each test makes its own tenants."""
    with started_gateway(tmp_path_factory.mktemp("responses")) as gw:
        yield gw


def _tenant(gw: LiveGateway, name: str, **limits: Any) -> str:
    # Tenant names are unique per database; the module shares one.
    return gw.tenant(f"{name}-{len(gw.secrets)}", **limits)


def _records(gw: LiveGateway, request_id: str) -> list[Any]:
    return [r for r in gw.usage.records if r.request_id == request_id]


def _post(gw: LiveGateway, key: str, body: Any) -> httpx.Response:
    return post_json(gw.base_url, "/v1/responses", key, body)


def test_create_returns_a_response_with_usage_and_one_usage_record(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    out = client.responses.create(
        model=gateway.model,
        input="Tell me about caches.",
        instructions="Answer briefly.",
        max_output_tokens=8,
        temperature=0,
        metadata={"ticket": "42"},
    )
    assert out.id.startswith("resp_") and out.object == "response"
    assert out.metadata == {"ticket": "42"}
    assert out.model == gateway.model and out.instructions == "Answer briefly."
    assert out.usage is not None and out.usage.input_tokens > 0
    assert 1 <= out.usage.output_tokens <= 8
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.output_tokens_details.reasoning_tokens == 0
    assert out.usage.input_tokens_details.cached_tokens == 0
    [item] = out.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert out.output_text == item.content[0].text  # type: ignore[union-attr]
    if out.usage.output_tokens == 8:  # the random model ran out of budget
        assert out.status == "incomplete" and item.status == "incomplete"
        assert out.incomplete_details is not None
        assert out.incomplete_details.reason == "max_output_tokens"
    else:  # it sampled EOS first
        assert out.status == "completed" and out.incomplete_details is None
    [record] = _records(gateway, out.id)
    assert record.status == 200 and record.client_disconnected is False
    assert record.prompt_tokens == out.usage.input_tokens
    assert record.completion_tokens == out.usage.output_tokens
    # Retrieved as created, for its own tenant only.
    assert client.responses.retrieve(out.id).model_dump() == out.model_dump()


def test_stream_sends_the_typed_events_in_order_and_ends_with_usage(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    events = list(
        client.responses.create(
            model=gateway.model, input="Hello", max_output_tokens=6, temperature=0, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[:4] == STREAM_TYPES
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas) : -1] == CLOSING_TYPES
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert types[-1] == (
        "response.completed" if final.status == "completed" else "response.incomplete"
    )
    text = "".join(d.delta for d in deltas)  # type: ignore[union-attr]
    assert events[4 + len(deltas)].text == text  # type: ignore[union-attr]
    assert final.output_text == text and final.usage is not None
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"  # type: ignore[union-attr]
    [record] = _records(gateway, final.id)
    assert record.status == 200 and record.completion_tokens == final.usage.output_tokens
    assert 1 <= final.usage.output_tokens <= 6
    # A streamed response is stored like any other.
    assert client.responses.retrieve(final.id).output_text == text


def test_a_stream_cut_short_is_metered_once_and_not_stored(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    stream = client.responses.create(
        model=gateway.model, input="Hello", max_output_tokens=400, temperature=0, stream=True
    )
    events = iter(stream)
    created = next(events)
    for _ in range(6):  # the opening events and a few deltas
        next(events)
    stream.close()
    response_id = created.response.id  # type: ignore[union-attr]
    deadline = time.monotonic() + 20
    while not _records(gateway, response_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    [record] = _records(gateway, response_id)
    assert record.client_disconnected and record.finish_reason == "abort"
    assert 1 <= record.completion_tokens < 400
    assert gateway.engine.stats().num_running == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)


def test_previous_response_id_continues_the_conversation(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    first = client.responses.create(
        model=gateway.model, input="My name is Ada.", instructions="Be kind.", max_output_tokens=5
    )
    second = client.responses.create(
        model=gateway.model,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=3,
    )
    assert second.previous_response_id == first.id
    # The second prompt is exactly the conversation so far (instructions are not carried).
    same = client.chat.completions.create(
        model=gateway.model,
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=1,
    )
    assert same.usage is not None and second.usage is not None and first.usage is not None
    assert second.usage.input_tokens == same.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens
    # A third turn continues the second, which holds the whole chain.
    third = client.responses.create(
        model=gateway.model, input="Bye.", previous_response_id=second.id, max_output_tokens=2
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens


def test_input_items_render_like_the_same_chat(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    out = client.responses.create(
        model=gateway.model,
        input=[
            {"role": "developer", "content": "Be terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "Bye"}]},
        ],
        max_output_tokens=1,
    )
    same = client.chat.completions.create(
        model=gateway.model,
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
        max_tokens=1,
    )
    assert out.usage is not None and same.usage is not None
    assert out.usage.input_tokens == same.usage.prompt_tokens


def test_another_tenants_response_is_not_found_like_an_unknown_one(gateway: LiveGateway) -> None:
    owner = gateway.client(_tenant(gateway, "owner"))
    other_key = _tenant(gateway, "other")
    other = gateway.client(other_key)
    mine = owner.responses.create(model=gateway.model, input="secret", max_output_tokens=2)
    for response_id in (mine.id, "resp_unknown"):
        r = _post(
            gateway,
            other_key,
            {"model": gateway.model, "input": "hi", "previous_response_id": response_id},
        )
        assert r.status_code == 404, r.text
        assert r.json()["error"] == {
            "message": f"previous response with id {response_id!r} not found",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
        with pytest.raises(openai.NotFoundError) as got:
            other.responses.retrieve(response_id)
        assert got.value.body == {  # type: ignore[comparison-overlap]
            "message": f"no response with id {response_id!r} found",
            "type": "invalid_request_error",
            "param": None,
            "code": "response_not_found",
        }
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(response_id)
    assert owner.responses.retrieve(mine.id).id == mine.id  # untouched by the other tenant
    owner.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(mine.id)


def test_store_false_keeps_nothing(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "acme"))
    out = client.responses.create(model=gateway.model, input="hi", max_output_tokens=2, store=False)
    assert out.model_dump()["store"] is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)


def test_rpm_limit_is_a_429_recorded_once(gateway: LiveGateway) -> None:
    key = _tenant(gateway, "busy", rpm=2)
    body = {"model": gateway.model, "input": "hi", "max_output_tokens": 1}
    assert [_post(gateway, key, body).status_code for _ in range(2)] == [200, 200]
    r = _post(gateway, key, body)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1
    assert gateway.usage.records[-1].status == 429
    assert gateway.usage.records[-1].prompt_tokens == 0


def test_token_budget_stops_the_tenant(gateway: LiveGateway) -> None:
    key = _tenant(gateway, "thrifty", token_budget=120, budget_period="day")
    body = {"model": gateway.model, "input": "hi", "max_output_tokens": 8}
    statuses = [_post(gateway, key, body).status_code for _ in range(20)]
    assert statuses[0] == 200 and statuses[-1] == 429
    r = _post(gateway, key, body)
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"


def test_model_outside_the_allow_list_is_403(gateway: LiveGateway) -> None:
    key = _tenant(gateway, "narrow", allowed_models=["something-else"])
    r = _post(gateway, key, {"model": gateway.model, "input": "hi"})
    assert r.status_code == 403 and r.json()["error"]["param"] == "model"
    assert gateway.usage.records[-1].status == 403


def test_a_chain_past_the_context_is_context_length_exceeded(gateway: LiveGateway) -> None:
    client = gateway.client(_tenant(gateway, "long"))
    key = gateway.secrets[-1]
    first = client.responses.create(
        model=gateway.model, input="word " * 300, max_output_tokens=60, temperature=0
    )
    assert first.usage is not None and first.usage.input_tokens > 300
    r = _post(
        gateway,
        key,
        {"model": gateway.model, "input": "word " * 200, "previous_response_id": first.id},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "input"
    assert gateway.usage.records[-1].status == 400
    assert gateway.usage.records[-1].prompt_tokens == 0


WEB_SEARCH = [{"type": "web_search"}]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": 5}, "input", None),
        ({"input": {"role": "user"}}, "input", None),
        ({"input": ""}, "input", None),
        ({"input": []}, "input", None),
        ({"input": [{"role": "tool", "content": "x"}]}, "input", None),
        ({"input": [{"role": "user", "content": 3}]}, "input", None),
        ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input", None),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input", None),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "unsupported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "unsupported",
        ),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", None),
        ({"input": "hi", "max_output_tokens": "many"}, "max_output_tokens", None),
        (
            {"input": "hi", "max_output_tokens": 10**6},
            "max_output_tokens",
            "context_length_exceeded",
        ),
        ({"input": "hi", "temperature": 3}, "temperature", None),
        ({"input": "hi", "top_p": 0}, "top_p", None),
        ({"input": "hi", "instructions": 7}, "instructions", None),
        ({"input": "hi", "stream": "yes"}, "stream", None),
        ({"input": "hi", "tools": WEB_SEARCH}, "tools", "unsupported"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice", None),  # without tools
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "text", "unsupported"),
        ({"input": "hi", "reasoning": {"effort": "low"}}, "reasoning", "unsupported"),
        ({"input": "hi", "max_tokens": 4}, "max_tokens", "unsupported"),
        ({"input": "hi", "n": 2}, "n", "unsupported"),
        ({"input": "hi", "previous_response_id": 12}, "previous_response_id", None),
        ({"input": "hi", "metadata": {"k": 1}}, "metadata", None),
        ({"input": "hi", "metadata": {"k" * 65: "v"}}, "metadata", None),
        ({"input": "hi", "metadata": {str(i): "v" for i in range(17)}}, "metadata", None),
        ({"input": "word " * 5000}, "input", "context_length_exceeded"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    gateway: LiveGateway, body: dict[str, Any], param: str, code: str | None
) -> None:
    key = gateway.secrets[0] if gateway.secrets else _tenant(gateway, "acme")
    r = _post(gateway, key, {"model": gateway.model, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if code == "unsupported" and "tools" in body:
        assert body["tools"][0]["type"] in err["message"]
