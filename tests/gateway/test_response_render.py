"""Response objects and stream events validate as the openai SDK's own types, in order."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from gateway.response_render import ResponseDraft, ResponseEvents
from gateway.schemas.responses import make_response_usage

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def draft() -> ResponseDraft:
    """A draft as the route makes one."""
    return ResponseDraft(
        response_id="resp_1",
        item_id="msg_1",
        created_at=1700000000,
        model="tiny",
        instructions="be brief",
        max_output_tokens=4,
        previous_response_id=None,
        store=True,
        temperature=None,
        top_p=None,
        user=None,
    )


def parse(chunk: bytes) -> Any:
    """One `event:`/`data:` SSE chunk as the SDK's typed event, checking both lines agree."""
    head, data = chunk.decode().removesuffix("\n\n").split("\n")
    payload = json.loads(data.removeprefix("data: "))
    assert head == f"event: {payload['type']}"
    return EVENTS.validate_python(payload)


@pytest.mark.parametrize(
    ("finish", "status", "last"),
    [("stop", "completed", "response.completed"), ("length", "incomplete", "response.incomplete")],
)
def test_a_stream_is_the_sdks_event_sequence(finish: str, status: str, last: str) -> None:
    events = ResponseEvents(draft())
    chunks = [*events.opening(), *events.delta("Hel"), *events.delta("lo")]
    usage = make_response_usage(7, 2, 0)
    final = draft().response(text=events.text, finish_reason=finish, usage=usage, completed_at=1)
    parsed = [parse(c) for c in [*chunks, *events.closing(final)]]
    assert [e.type for e in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert [e.sequence_number for e in parsed] == list(range(10))
    assert parsed[6].text == "Hello" and parsed[8].item.status == status
    end = parsed[-1].response
    assert end.status == status and end.output_text == "Hello"
    assert end.usage.input_tokens == 7 and end.usage.total_tokens == 9
    if status == "incomplete":
        assert end.incomplete_details.reason == "max_output_tokens"
    else:
        assert end.incomplete_details is None


def test_an_error_event_is_the_sdks_error() -> None:
    events = ResponseEvents(draft())
    events.opening()
    body = {"error": {"message": "boom", "type": "server_error", "param": None, "code": "x"}}
    event = parse(events.error(body))
    assert event.type == "error" and event.message == "boom" and event.sequence_number == 4


def test_a_finished_response_validates_as_the_sdks_response() -> None:
    final = draft().response(
        text="hi", finish_reason="stop", usage=make_response_usage(3, 1, 2), completed_at=5
    )
    sdk = Response.model_validate(json.loads(final.model_dump_json()))
    assert sdk.output_text == "hi" and sdk.status == "completed"
    assert sdk.usage is not None and sdk.usage.input_tokens_details.cached_tokens == 2
