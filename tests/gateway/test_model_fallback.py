"""Deliberate degradation (issue 42 item 3): an interactive request that the engine's
queue refuses as overloaded is retried once on the model's registry fallback, when the
tenant and key may use it; the response names the fallback, the usage is metered at the
fallback's price, and the limits are charged once. Otherwise the client gets the 503.

Real engines over the fake fast model, watched (tests/utils/watched_engine.py): the
overloaded ones refuse every request at submit with the real front's
`EngineOverloadedError`, as a full waiting queue does (tests/utils/engine_faults.py);
the fallback answers greedy requests with REPLY (tests/utils/scripted_engine.py). The
gateway tokenizes bytes, and the fallback's tokenizer counts two tokens a byte, so a
re-tokenized prompt is told from a reused one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from admin import registry
from engine.fronts.async_engine import AsyncEngine
from engine.model.hf_loader import architecture_from_config
from engine.request import EngineRequest
from engine_hop.in_process import InProcessEngineClient
from tenancy import store
from tests.utils.byte_tokenizer import ByteTokenizer
from tests.utils.engine_faults import SubmitPatch, overloaded, refuse
from tests.utils.fallback_gateway import (
    SMALL_PRICE,
    MeteredGateway,
    fallback_count,
    register_big_falling_back_to_small,
    sqlite_sessions,
)
from tests.utils.fast_fake_model import (
    GATEWAY_ENGINE_OPTIONS,
    fast_fake_llm_engine,
    gateway_test_engine,
)
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.scripted_engine import inject_script, one_token_per_char
from tests.utils.tiny_model import tiny_config
from tests.utils.watched_engine import Watched

REPLY = "fallback says hi"
MESSAGES = [{"role": "user", "content": "hello"}]


class DoubleByteTokenizer(ByteTokenizer):
    """Two tokens per byte: the fallback's own tokenizer, unlike the primary's."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Every byte twice."""
        return [t for b in super().encode(text, add_special_tokens) for t in (b, b)]


def overloaded_engine() -> Watched:
    """A real front whose every submit is refused as a full waiting queue refuses it;
    the gateway tokenizes bytes for it."""
    engine = Watched(gateway_test_engine())
    engine.tokenizer = ByteTokenizer()
    refuse(engine)
    return engine


def reply_engine() -> AsyncEngine:
    """A real front whose greedy requests answer REPLY, one token a character but for
    "hi": with the end-of-sequence token, `len(REPLY)` completion tokens."""
    llm = fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS)
    return AsyncEngine(inject_script(llm, one_token_per_char(llm, REPLY, but="hi")))


def refuse_after(engine: Any, n: int) -> SubmitPatch:
    """Takes the first `n` submits, then refuses every one as a full waiting queue does."""
    taken: list[str] = []

    def wrap(real: Callable[[EngineRequest], Any], request: EngineRequest) -> Any:
        if len(taken) >= n:
            raise overloaded()
        taken.append(request.request_id)
        return real(request)

    return SubmitPatch(engine, wrap)


class Served(MeteredGateway):
    """One gateway serving "big" (always overloaded, falls back to "small"), "small",
    "lone" (overloaded, no fallback) and "orphan" (overloaded, falls back to a registered
    model this gateway does not serve), over the real registry reader and metering."""

    def __init__(self, tmp_path: Path) -> None:
        self.sessions = sqlite_sessions(tmp_path)
        self.tmp_path = tmp_path
        self.big = overloaded_engine()
        self.lone = overloaded_engine()
        self.orphan = overloaded_engine()
        self.small = Watched(reply_engine())
        self.small.tokenizer = DoubleByteTokenizer()
        with self.sessions() as s:
            self.acme = store.create_tenant(s, name="acme").id
            store.create_tenant(s, name="other")
            store.set_limits(s, tenant_name="acme", rpm=5)
            names = ("big", "small", "lone", "orphan", "unserved")
            register_big_falling_back_to_small(s, names, self.acme)
            registry.update_model(s, name="orphan", fallback_model="unserved")
        engines = {"big": self.big, "small": self.small, "lone": self.lone, "orphan": self.orphan}
        self.serve(
            tmp_path, {n: InProcessEngineClient(e, model_name=n) for n, e in engines.items()}
        )
        self.key = self.new_key("acme")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, TestClient]]:
    s = Served(tmp_path)
    try:
        with TestClient(s.app) as client:
            yield s, client
    finally:
        s.close()


def _post(
    client: TestClient, path: str, body: dict[str, Any], key: str, **kw: Any
) -> httpx.Response:
    return client.post(path, json=body, headers={"Authorization": f"Bearer {key}"}, **kw)


# Each API's body for model "big" and where its answer's text lies.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 32}),
    "completions": ("/v1/completions", {"prompt": "hello", "max_tokens": 32}),
    "responses": ("/v1/responses", {"input": "hello", "max_output_tokens": 32, "store": False}),
}


def _text(api: str, body: dict[str, Any]) -> str:
    if api == "chat":
        return str(body["choices"][0]["message"]["content"])
    if api == "completions":
        return str(body["choices"][0]["text"])
    return str(body["output"][0]["content"][0]["text"])


@pytest.mark.parametrize("api", sorted(CALLS))
def test_an_overloaded_model_answers_from_its_fallback(
    served: tuple[Served, TestClient], api: str
) -> None:
    s, client = served
    path, body = CALLS[api]
    r = _post(client, path, {"model": "big", "temperature": 0, **body}, s.key)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == "small"
    assert _text(api, answer) == REPLY
    assert s.big.domains == [] and len(s.small.domains) == 1
    # One admission: rpm 5 was charged once, not once per model tried.
    assert r.headers["x-ratelimit-remaining-requests"] == "4"
    (row,) = s.usage()
    assert (row.model, row.status) == ("small", 200)
    # The fallback's own tokenizer counted the prompt (two tokens a byte), and the
    # response reports the same count.
    usage = answer["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    assert row.prompt_tokens == prompt and prompt % 2 == 0 and prompt > 0
    assert row.completion_tokens == len(REPLY)
    # Metered at the fallback's price, not the model the client asked for.
    assert row.cost_pico_usd == SMALL_PRICE.cost_pico_usd(
        prompt_tokens=row.prompt_tokens, cached_tokens=0, completion_tokens=len(REPLY)
    )
    assert fallback_count(client) == 1.0


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
def test_a_streamed_request_answers_from_the_fallback(
    served: tuple[Served, TestClient], api: str
) -> None:
    s, client = served
    path, body = CALLS[api]
    stream = {"model": "big", "temperature": 0, "stream": True, **body}
    if api != "responses":
        stream["stream_options"] = {"include_usage": True}
    r = _post(client, path, stream, s.key)
    assert r.status_code == 200, r.text
    events = [
        json.loads(line.removeprefix("data: "))
        for line in r.text.splitlines()
        if line.startswith("data: {")
    ]
    if api == "responses":
        models = {e["response"]["model"] for e in events if "response" in e}
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    else:
        models = {e["model"] for e in events}
        text = "".join(
            c["delta"].get("content") or "" if api == "chat" else c["text"]
            for e in events
            for c in e["choices"]
        )
    assert models == {"small"} and text == REPLY
    (row,) = s.usage()
    assert (row.model, row.status, row.completion_tokens) == ("small", 200, len(REPLY))
    assert fallback_count(client) == 1.0


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_overloaded"
    assert "retry-after" in r.headers


@pytest.mark.parametrize(
    ("case", "model", "extra"),
    [
        ("no fallback", "lone", {}),
        ("fallback not served here", "orphan", {}),
        ("batch traffic class", "big", {"service_tier": "flex"}),
    ],
)
def test_no_usable_fallback_is_the_503(
    served: tuple[Served, TestClient], case: str, model: str, extra: dict[str, Any]
) -> None:
    s, client = served
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, **extra}
    _refused(_post(client, "/v1/chat/completions", body, s.key))
    assert s.small.domains == [], case
    (row,) = s.usage()
    assert (row.model, row.status, row.prompt_tokens) == (model, 503, 0)
    assert fallback_count(client) == 0.0


def test_a_fallback_the_tenant_may_not_use_is_the_503(served: tuple[Served, TestClient]) -> None:
    s, client = served
    body = {"model": "big", "messages": MESSAGES, "max_tokens": 4}
    # The registry lists only acme for "small" ...
    _refused(_post(client, "/v1/chat/completions", body, s.new_key("other")))
    # ... and this key of acme may use "big" alone.
    only_big = s.new_key("acme", allowed_models=["big"])
    _refused(_post(client, "/v1/chat/completions", body, only_big))
    assert s.small.domains == []
    assert [(u.model, u.status) for u in s.usage()] == [("big", 503), ("big", 503)]
    # An acme key that may use both gets the fallback.
    assert _post(client, "/v1/chat/completions", body, s.key).json()["model"] == "small"


def test_an_overloaded_fallback_is_the_first_503_and_keeps_nothing_queued(
    served: tuple[Served, TestClient],
) -> None:
    s, client = served
    refuse_after(s.small, 1)  # the fallback queues the first prompt, then refuses the second
    body = {"model": "big", "prompt": ["one", "two"], "max_tokens": 4}
    _refused(_post(client, "/v1/completions", body, s.key))
    assert len(s.small.domains) == 1 and len(s.small.aborted) == 1
    assert s.small.running == set() and s.big.running == set()
    (row,) = s.usage()
    assert (row.model, row.status) == ("big", 503)
    assert fallback_count(client) == 0.0


def test_a_fallback_that_cannot_fit_is_the_503(served: tuple[Served, TestClient]) -> None:
    s, client = served
    s.app.state.cloister.engines["small"].max_model_len = 16  # too short for this prompt
    body = {"model": "big", "prompt": "a prompt of some length", "max_tokens": 4}
    _refused(_post(client, "/v1/completions", body, s.key))
    assert s.small.domains == []


def test_an_adapter_request_is_never_moved(served: tuple[Served, TestClient]) -> None:
    s, client = served
    with s.sessions() as session:
        registry.register_adapter(session, name="ad", base_model="big", rank=8, source_path="/a")
    folder = make_peft_adapter(s.tmp_path / "ad", architecture_from_config(tiny_config()), 8, 8)
    assert client.portal is not None
    client.portal.call(s.big.load_adapter, "ad", str(folder))
    tried: list[str] = []
    submit = s.small.submit

    def counted(request: EngineRequest) -> Any:
        tried.append(request.request_id)
        return submit(request)

    s.small.submit = counted  # type: ignore[method-assign]
    body = {"model": "big:ad", "messages": MESSAGES, "max_tokens": 4}
    _refused(_post(client, "/v1/chat/completions", body, s.key))
    # The fallback serves the base model only: the adapter's request never reaches it.
    assert tried == []
    (row,) = s.usage()
    assert (row.model, row.adapter, row.status) == ("big", "ad", 503)
