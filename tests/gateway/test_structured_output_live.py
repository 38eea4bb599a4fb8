"""Structured output over HTTP with the openai SDK (issue 18, part 1): every constrained
answer parses, bad constraints are 400s that name the problem, bill nothing and stall
nobody. One live gateway over the tiny random model for the whole module."""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from engine.structured.spec import MAX_SPEC_BYTES
from tests.utils.live_gateway import LiveGateway, started_gateway

MESSAGES: Any = [{"role": "user", "content": "Describe a pet as JSON."}]


class Species(StrEnum):
    CAT = "cat"
    DOG = "dog"


class Owner(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)


class Pet(BaseModel):
    """Nested: the SDK turns Owner into a $defs entry and a $ref."""

    species: Species
    nickname: str = Field(max_length=8)
    owner: Owner
    vaccinated: bool


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway over the tiny random model."""
    with started_gateway(tmp_path_factory.mktemp("structured")) as gateway:
        yield gateway


def _post(gw: LiveGateway, key: str, path: str = "/v1/chat/completions", **body: Any) -> Any:
    payload = {"model": "tiny", **body}
    if path.endswith("chat/completions"):
        payload.setdefault("messages", MESSAGES)
    return httpx.post(
        gw.base_url + path, headers={"Authorization": f"Bearer {key}"}, json=payload, timeout=60
    )


def test_sdk_parse_of_a_nested_model_always_parses(gw: LiveGateway) -> None:
    client = gw.client(gw.tenant("parse"))

    def one(seed: int) -> tuple[Pet | None, str | None]:
        completion = client.beta.chat.completions.parse(
            model="tiny",
            messages=MESSAGES,
            response_format=Pet,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        choice = completion.choices[0]
        return choice.message.parsed, choice.finish_reason

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    for parsed, finish_reason in results:
        assert isinstance(parsed, Pet)
        assert isinstance(parsed.owner, Owner)
        assert finish_reason == "stop"
    # Random weights with temperature 1: the seeds give different pets.
    assert len({p.model_dump_json() for p, _ in results}) > 1


def test_json_object_is_valid_json_every_time(gw: LiveGateway) -> None:
    key = gw.tenant("json-object")
    # Random weights rarely close a string; a nudge toward quotes and braces keeps
    # objects short enough for max_tokens, and the grammar still decides what is legal.
    bias = {"18": 40, "109": 40}
    for seed in range(6):
        r = _post(
            gw,
            key,
            response_format={"type": "json_object"},
            temperature=1.0,
            seed=seed,
            max_tokens=150,
            logit_bias=bias,
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_guided_regex_and_guided_choice(gw: LiveGateway) -> None:
    key = gw.tenant("guided")
    for seed in range(4):
        r = _post(
            gw, key, guided_regex=r"[0-9]{3}-[a-z]{2,4}", temperature=1.0, seed=seed, max_tokens=20
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", choice["message"]["content"]), choice
        assert choice["finish_reason"] == "stop"
        r = _post(
            gw,
            key,
            "/v1/completions",
            prompt="Pick one:",
            guided_choice=["red", "green", "blue sky"],
            temperature=1.0,
            seed=seed,
            max_tokens=20,
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["text"] in {"red", "green", "blue sky"}
        assert choice["finish_reason"] == "stop"


def test_structured_outputs_lark_with_embedded_json(gw: LiveGateway) -> None:
    """The shape helper H2's strict tool calls use: Lark around a %json schema."""
    key = gw.tenant("lark")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
        # Lark's %json allows free whitespace by default; a random model pads forever.
        "x-guidance": {"whitespace_flexible": False},
    }
    grammar = f'start: "<tool_call>" %json{json.dumps(schema)} "</tool_call>"'
    r = _post(gw, key, structured_outputs={"grammar": grammar}, temperature=0.0, max_tokens=40)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    inner = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.S)
    assert inner is not None, text
    assert 0 <= json.loads(inner.group(1))["n"] <= 9


def test_a_streamed_structured_request(gw: LiveGateway) -> None:
    client = gw.client(gw.tenant("stream"))
    deltas = []
    with client.beta.chat.completions.stream(
        model="tiny",
        messages=MESSAGES,
        response_format=Pet,
        temperature=1.0,
        seed=7,
        max_tokens=120,
    ) as stream:
        for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
        final = stream.get_final_completion()
    assert len(deltas) > 3  # it came in pieces
    choice = final.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Pet)
    assert Pet.model_validate_json("".join(deltas)) == choice.message.parsed


def test_a_too_large_schema_is_a_400_while_another_tenant_streams(gw: LiveGateway) -> None:
    streamer = gw.client(gw.tenant("bystander"))
    bad_key = gw.tenant("too-big")
    stream = streamer.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=48, temperature=0.0, stream=True
    )
    chunks = iter(stream)
    first = next(chunks)  # the bystander's request is running
    assert first.choices
    props = {f"field_{i:05d}": {"type": "string", "maxLength": 5} for i in range(3000)}
    big = {"type": "object", "properties": props, "required": sorted(props)}
    assert len(json.dumps(big)) > MAX_SPEC_BYTES
    r = _post(
        gw,
        bad_key,
        response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": big}},
        max_tokens=8,
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "response_format"
    assert str(MAX_SPEC_BYTES) in error["message"]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length"  # the bystander's stream ran to its end


def test_an_unsupported_schema_feature_is_named(gw: LiveGateway) -> None:
    client = gw.client(gw.tenant("unsupported"))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "not": {"required": ["a"]}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert '"not"' in error["message"] and error["param"] == "response_format"
    r = _post(gw, gw.tenant("bad-regex"), guided_regex="(?=a)b", max_tokens=4)
    assert r.status_code == 400
    assert "look-around" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "guided_regex"


def test_a_refused_constraint_bills_nothing_and_charges_no_limit(gw: LiveGateway) -> None:
    key = gw.tenant("billing", rpm=2, token_budget=100, budget_period="day")
    before = len(gw.usage.records)
    for _ in range(6):  # over the rpm and the budget, had any of them been charged
        r = _post(gw, key, guided_regex="(unclosed", max_tokens=40)
        assert r.status_code == 400, r.text
    r = _post(gw, key, guided_choice=["yes", "no"], max_tokens=40)
    assert r.status_code == 200, r.text
    records = gw.usage.records[before:]
    refused = [rec for rec in records if rec.status == 400]
    assert len(refused) == 6
    for rec in refused:
        assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (0, 0, 0)
    assert [rec.status for rec in records].count(200) == 1


def test_two_constraints_at_once_are_refused(gw: LiveGateway) -> None:
    r = _post(
        gw,
        gw.tenant("both"),
        response_format={"type": "json_object"},
        guided_regex="a+",
        max_tokens=4,
    )
    assert r.status_code == 400
    assert "one output constraint" in r.json()["error"]["message"]
