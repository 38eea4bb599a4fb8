"""vLLM's extra sampling parameters over HTTP: each reaches the engine and does what it
says, and a bad value is a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.utils.live_gateway import LiveGateway, started_gateway

EOS = 2  # tests/utils/tiny_model.py
CHAT = {"messages": [{"role": "user", "content": "Say something long."}]}
PROMPT = {"prompt": "Once upon a time there was"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway over the tiny random-weight model."""
    with started_gateway(tmp_path_factory.mktemp("extras")) as gw:
        yield gw


@pytest.fixture(scope="module")
def key(gateway: LiveGateway) -> str:
    """A key with no output cap."""
    return gateway.tenant("extras")


def call(gw: LiveGateway, key: str, body: dict[str, Any], *, chat: bool) -> httpx.Response:
    """POST a chat or a text completion (the model filled in)."""
    url = "/v1/chat/completions" if chat else "/v1/completions"
    return httpx.post(
        gw.base_url + url,
        json={"model": gw.model, **(CHAT if chat else PROMPT), **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def text_of(r: httpx.Response) -> str:
    """The first choice's text."""
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


@pytest.mark.parametrize("chat", [True, False])
def test_top_k_1_and_min_p_1_are_greedy_at_temperature_1(
    gateway: LiveGateway, key: str, chat: bool
) -> None:
    greedy = text_of(call(gateway, key, {"max_tokens": 12, "temperature": 0}, chat=chat))
    sampled = [
        text_of(call(gateway, key, {"max_tokens": 12, "temperature": 1, "seed": s}, chat=chat))
        for s in (1, 2, 3)
    ]
    if not chat:  # the tiny model's chat template makes its next token near-certain
        assert any(t != greedy for t in sampled), "temperature 1 alone should not be greedy"
    for seed in (1, 2, 3):
        for extra in ({"top_k": 1}, {"min_p": 1.0}):
            body = {"max_tokens": 12, "temperature": 1, "seed": seed, **extra}
            assert text_of(call(gateway, key, body, chat=chat)) == greedy, extra


def test_repetition_penalty_changes_the_output(gateway: LiveGateway, key: str) -> None:
    body = {"max_tokens": 24, "temperature": 0}
    plain = text_of(call(gateway, key, body, chat=False))
    penalised = text_of(call(gateway, key, {**body, "repetition_penalty": 50.0}, chat=False))
    neutral = text_of(call(gateway, key, {**body, "repetition_penalty": 1.0}, chat=False))
    assert neutral == plain and penalised != plain


def _finish(r: httpx.Response) -> tuple[str, int]:
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"]


def test_ignore_eos_min_tokens_and_stop_token_ids(gateway: LiveGateway, key: str) -> None:
    eos_first = {"max_tokens": 6, "temperature": 0, "logit_bias": {str(EOS): 100}}
    assert _finish(call(gateway, key, eos_first, chat=False)) == ("stop", 1)
    ignored = call(gateway, key, {**eos_first, "ignore_eos": True}, chat=False)
    assert _finish(ignored) == ("length", 6)
    at_least = call(gateway, key, {**eos_first, "min_tokens": 3}, chat=True)
    reason, tokens = _finish(at_least)
    assert reason == "stop" and tokens >= 3
    five_first = {"max_tokens": 6, "temperature": 0, "logit_bias": {"5": 100}}
    assert _finish(call(gateway, key, five_first, chat=False)) == ("length", 6)
    stopped = call(gateway, key, {**five_first, "stop_token_ids": [5]}, chat=False)
    assert _finish(stopped) == ("stop", 1)


def test_ignore_eos_keeps_the_keys_output_cap(gateway: LiveGateway) -> None:
    capped = gateway.tenant("extras-capped", max_output_tokens=4)
    body = {"temperature": 0, "logit_bias": {str(EOS): 100}, "ignore_eos": True}
    assert _finish(call(gateway, capped, body, chat=False)) == ("length", 4)


BAD = [
    ("top_k", '"3"'),
    ("top_k", "1.5"),
    ("top_k", "true"),
    ("top_k", "-2"),
    ("min_p", "NaN"),
    ("min_p", "1.5"),
    ("min_p", "-0.1"),
    ("min_p", '"0.1"'),
    ("repetition_penalty", "0"),
    ("repetition_penalty", "Infinity"),
    ("repetition_penalty", "1e9"),
    ("min_tokens", "-1"),
    ("min_tokens", "50"),  # over max_tokens
    ("ignore_eos", '"yes"'),
    ("ignore_eos", "1"),
    ("stop_token_ids", "[1e400]"),
    ("stop_token_ids", "[-1]"),
    ("stop_token_ids", "[99999999]"),
    ("stop_token_ids", '"5"'),
]


@pytest.mark.parametrize(("field", "literal"), BAD)
def test_a_bad_value_is_a_400_naming_it(
    gateway: LiveGateway, key: str, field: str, literal: str
) -> None:
    for chat in (True, False):
        head = '"messages": [{"role": "user", "content": "hi"}]' if chat else '"prompt": "hi"'
        url = "/v1/chat/completions" if chat else "/v1/completions"
        body = f'{{"model": "{gateway.model}", {head}, "max_tokens": 4, "{field}": {literal}}}'
        r = httpx.post(
            gateway.base_url + url,
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            timeout=60,
        )
        assert r.status_code == 400, (field, literal, chat, r.text)
        error = r.json()["error"]
        assert error["param"] == field and error["type"] == "invalid_request_error", error
