"""Constraints that cannot finish, dead ends and deep schemas over HTTP (issue 46).

A grammar that can never be completed is a 400 at compile time; one that reaches a
dead end after some output ends that request alone, with what was delivered billed
(status 200, finish_reason "length"); a deeply nested schema is a 400 on a connection
that stays open. A greedy bystander in the same engine gets the text it gets alone.
One live gateway over the tiny random model for the whole module.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.usage import UsageRecord
from tests.utils.live_gateway import LiveGateway, started_gateway

MESSAGES: Any = [{"role": "user", "content": "Say something."}]
# Free text, then a lexeme whose language is empty: llguidance compiles it and computes
# the first masks, then finds no token to continue with after the 24 letters.
DEAD_END = r"start: /[a-z]{24}/ /[^\s\S]/"
NEVER_FINISH = [
    'start: "a" start',
    'start: "a" start | "b" start',
    'start: /[a-z ]*/ x\nx: "a" x',
    'start: x\nx: "(" y\ny: ")" x',
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway over the tiny random model."""
    with started_gateway(tmp_path_factory.mktemp("structured-faults")) as gateway:
        yield gateway


def _post(gw: LiveGateway, key: str, client: httpx.Client | None = None, **body: Any) -> Any:
    payload = {"model": "tiny", "messages": MESSAGES, **body}
    post = client.post if client is not None else httpx.post
    return post(
        gw.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=payload,
        timeout=60,
    )


def _record(gw: LiveGateway, request_id: str) -> UsageRecord:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [r for r in gw.usage.records if r.request_id == request_id]
        if found:
            assert len(found) == 1
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no usage record for {request_id}")


class Bystander:
    """A greedy stream of another tenant, running while the faulty request is served."""

    BODY: Any = {"messages": MESSAGES, "max_tokens": 48, "temperature": 0.0}

    def __init__(self, gw: LiveGateway, expected: str) -> None:
        self.gw, self.expected = gw, expected
        # A fresh name each time: id(self) is reused once an earlier bystander is freed,
        # and the gateway (module-scoped) still holds that tenant.
        self.key = gw.tenant(f"bystander-{uuid.uuid4().hex}")
        self.started = threading.Event()
        self.text = ""
        self.reason: str | None = None
        self.thread = threading.Thread(target=self._run)

    @classmethod
    def alone(cls, gw: LiveGateway) -> str:
        """The bystander's text with the engine to itself."""
        r = _post(gw, gw.tenant(f"alone-{time.monotonic_ns()}"), **cls.BODY)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["message"]["content"])

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        body = {"model": "tiny", "stream": True, **self.BODY}
        url = self.gw.base_url + "/v1/chat/completions"
        with httpx.stream("POST", url, headers=headers, json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                self.text += choice["delta"].get("content") or ""
                if self.text:
                    self.started.set()
                self.reason = choice.get("finish_reason") or self.reason
        self.started.set()

    def __enter__(self) -> Bystander:
        self.thread.start()
        assert self.started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(60)
        assert (self.text, self.reason) == (self.expected, "length")


def test_a_grammar_that_can_never_finish_is_a_400(gw: LiveGateway) -> None:
    expected = Bystander.alone(gw)
    key = gw.tenant("never-finish")
    with Bystander(gw, expected):
        for grammar in NEVER_FINISH:
            r = _post(gw, key, guided_grammar=grammar, max_tokens=64)
            assert r.status_code == 400, (grammar, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error"
            assert error["param"] == "guided_grammar"
            assert error["code"] == "invalid_structured_output"
            assert "never" in error["message"], error
            record = _record(gw, r.headers["x-request-id"])
            assert record.status == 400
            assert (record.prompt_tokens, record.completion_tokens) == (0, 0)
        # The same through structured_outputs and response_format's Lark-embedding forms.
        r = _post(gw, key, structured_outputs={"grammar": NEVER_FINISH[0]}, max_tokens=8)
        assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"


def test_an_impossible_grammar_is_a_400(gw: LiveGateway) -> None:
    """A constraint no text matches: refused when compiled, not failed in the engine."""
    key = gw.tenant("impossible")
    for field, value in [
        ("guided_regex", r"[^\s\S]"),
        ("guided_grammar", r"start: /[^\s\S]/"),
        ("guided_grammar", 'start: A\nA: "a" & "b"'),
        ("guided_json", {"$ref": "#"}),
    ]:
        r = _post(gw, key, max_tokens=8, **{field: value})
        assert r.status_code == 400, (value, r.text)
        error = r.json()["error"]
        assert error["param"] == field and error["code"] == "invalid_structured_output"
        assert _record(gw, r.headers["x-request-id"]).status == 400


def test_a_dead_end_after_free_text_is_delivered_and_billed(gw: LiveGateway) -> None:
    expected = Bystander.alone(gw)
    key = gw.tenant("dead-end")
    with Bystander(gw, expected):
        r = _post(gw, key, guided_grammar=DEAD_END, max_tokens=64, temperature=1.0, seed=3)
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    text = choice["message"]["content"]
    assert len(text) == 24 and text.isalpha(), text
    record = _record(gw, body["id"])
    assert record.status == 200 and record.finish_reason == "length"
    assert record.completion_tokens == body["usage"]["completion_tokens"] > 0
    assert record.prompt_tokens == body["usage"]["prompt_tokens"] > 0


def test_a_streamed_dead_end_bills_what_was_delivered(gw: LiveGateway) -> None:
    expected = Bystander.alone(gw)
    key = gw.tenant("dead-end-stream")
    payload = {
        "model": "tiny",
        "messages": MESSAGES,
        "guided_grammar": DEAD_END,
        "max_tokens": 64,
        "temperature": 1.0,
        "seed": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        Bystander(gw, expected),
        httpx.stream(
            "POST",
            gw.base_url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=payload,
            timeout=60,
        ) as r,
    ):
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert not [e for e in events if "error" in e]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert len(text) == 24, text
    reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert reasons == ["length"]
    usage = events[-1]["usage"]
    record = _record(gw, events[0]["id"])
    assert record.status == 200 and record.finish_reason == "length"
    assert record.completion_tokens == usage["completion_tokens"] > 0
    assert not record.client_disconnected


def _nested_schema(depth: int) -> str:
    return '{"type":"array","items":' * depth + '{"type":"integer"}' + "}" * depth


def test_a_deeply_nested_guided_json_is_a_400_on_a_kept_connection(gw: LiveGateway) -> None:
    key = gw.tenant("deep-json")
    ports: set[int] = set()
    with httpx.Client(timeout=60) as client:
        for value in [
            _nested_schema(5000),  # deeper than Python's recursion limit
            json.loads(_nested_schema(300)),  # parsed with the body, too deep for the compiler
            _nested_schema(300),
        ]:
            r = _post(gw, key, client, guided_json=value, max_tokens=8)
            assert r.status_code == 400, r.text[:300]
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["param"] == "guided_json"
            assert "deep" in error["message"], error
            assert r.headers.get("connection") != "close"
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
        r = _post(gw, key, client, guided_json=_nested_schema(3), max_tokens=24)
        assert r.status_code == 200, r.text
        ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert len(ports) == 1  # one keep-alive connection for all four
