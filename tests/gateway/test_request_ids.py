"""x-request-id on every answer, the same id in the usage record and the request's log
lines; a client's id echoed, kept per tenant, and never the key of its usage."""

from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from admin.metering import usage_row
from admin.models import UsageRow
from admin.usage_store import write_usage
from gateway.usage import UsageRecord
from tests.utils.engine_faults import refuse
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, started_gateway

OWN = "x-cloister-request-id"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway over the fast fake engine (ids do not depend on the model)."""
    with started_gateway(tmp_path_factory.mktemp("ids"), engine=gateway_test_engine()) as gw:
        yield gw


@pytest.fixture(scope="module")
def key(gateway: LiveGateway) -> str:
    """A key of tenant "ids-a"."""
    return gateway.tenant("ids-a")


def post(gw: LiveGateway, key: str, body: dict[str, Any], **headers: str | bytes) -> httpx.Response:
    """POST /v1/chat/completions with `body` (the model filled in)."""
    return httpx.post(
        gw.base_url + "/v1/chat/completions",
        json={"model": gw.model, **body},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def records(gw: LiveGateway, request_id: str) -> list[UsageRecord]:
    """The usage records of the gateway's id `request_id`."""
    return [r for r in gw.usage.records if r.request_id == request_id]


def log_lines(gw: LiveGateway) -> list[dict[str, Any]]:
    """Every log line so far, parsed (each must be one JSON object)."""
    return [json.loads(line) for line in gw.logs.getvalue().splitlines() if line]


def test_success_names_its_request_everywhere(gateway: LiveGateway, key: str) -> None:
    r = post(gateway, key, CHAT)
    assert r.status_code == 200
    own = r.json()["id"]
    assert r.headers["x-request-id"] == r.headers[OWN] == own and own.startswith("chatcmpl-")
    [record] = records(gateway, own)
    assert record.client_request_id is None
    lines = [line for line in log_lines(gateway) if line.get("request_id") == own]
    assert lines, "no log line of the request names its id"
    assert any(line["logger"] == "cloister.access" for line in lines)  # the access line


def test_stream_and_completions_carry_the_id(gateway: LiveGateway, key: str) -> None:
    with httpx.stream(
        "POST",
        gateway.base_url + "/v1/completions",
        json={"model": gateway.model, "prompt": "hi", "max_tokens": 3, "stream": True},
        headers={"Authorization": f"Bearer {key}", "x-request-id": "stream-1"},
        timeout=30,
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    assert r.headers["x-request-id"] == "stream-1"
    own = r.headers[OWN]
    assert own.startswith("cmpl-") and {json.loads(e)["id"] for e in events} == {own}
    [record] = records(gateway, own)
    assert record.client_request_id == "stream-1"


def test_client_id_is_echoed_and_kept_beside_the_gateways(gateway: LiveGateway, key: str) -> None:
    r = post(gateway, key, CHAT, **{"x-request-id": "client-7/abc:DEF_1"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "client-7/abc:DEF_1"
    own = r.headers[OWN]
    assert own == r.json()["id"] != "client-7/abc:DEF_1"
    [record] = records(gateway, own)
    assert record.client_request_id == "client-7/abc:DEF_1"
    lines = [line for line in log_lines(gateway) if line.get("request_id") == own]
    assert lines and all(line["client_request_id"] == "client-7/abc:DEF_1" for line in lines)


def test_errors_carry_the_id(gateway: LiveGateway, key: str) -> None:
    url = gateway.base_url
    auth = {"Authorization": f"Bearer {key}"}
    limited = gateway.tenant("ids-limited", rpm=1)
    answers = {
        400: post(gateway, key, {**CHAT, "temperature": 9}, **{"x-request-id": "e400"}),
        401: post(gateway, "sk-wrong", CHAT, **{"x-request-id": "e401"}),
        404: post(gateway, key, {**CHAT, "model": "nope"}, **{"x-request-id": "e404"}),
        413: httpx.post(
            url + "/v1/chat/completions",
            content=b"x" * (9 * 1024 * 1024),
            headers={**auth, "x-request-id": "e413"},
            timeout=30,
        ),
    }
    post(gateway, limited, CHAT)
    answers[429] = post(gateway, limited, CHAT, **{"x-request-id": "e429"})
    with refuse(gateway.engine):  # the engine refuses everything: 503
        answers[503] = post(gateway, key, CHAT, **{"x-request-id": "e503"})
    for status, r in answers.items():
        assert r.status_code == status, (status, r.text)
        assert r.headers["x-request-id"] == f"e{status}", status
        assert r.headers[OWN].startswith("chatcmpl-"), status
        assert "error" in r.json()
    # A refusal after authentication is metered under the same ids.
    for status in (400, 404, 429, 503):
        [record] = records(gateway, answers[status].headers[OWN])
        assert (record.status, record.client_request_id) == (status, f"e{status}")
    # Routes without a lifecycle get an id of their own.
    for r in (
        httpx.get(url + "/v1/models", headers=auth, timeout=30),
        httpx.get(url + "/v1/nowhere", headers={"x-request-id": "lost"}, timeout=30),
        httpx.get(url + "/health", timeout=30),
    ):
        assert r.headers[OWN].startswith("req-"), r.url
    assert r.headers["x-request-id"] == r.headers[OWN]


def test_same_client_id_from_two_tenants_and_twice_from_one(gateway: LiveGateway, key: str) -> None:
    other = gateway.tenant("ids-b")
    sent = [post(gateway, k, CHAT, **{"x-request-id": "retry-42"}) for k in (key, key, other)]
    assert all(r.status_code == 200 and r.headers["x-request-id"] == "retry-42" for r in sent)
    own = [r.headers[OWN] for r in sent]
    assert len(set(own)) == 3
    mine = [records(gateway, i)[0] for i in own]
    assert [m.client_request_id for m in mine] == ["retry-42"] * 3
    assert mine[0].tenant_id == mine[1].tenant_id != mine[2].tenant_id
    # Through the admin store into the database: all three kept, found per tenant.
    with gateway.sessions() as s:
        now = dt.datetime.now(dt.UTC)
        assert write_usage(s, [usage_row(m, now) for m in mine]) == 3
        rows = s.execute(
            sa.select(UsageRow.tenant_id, sa.func.count())
            .where(UsageRow.client_request_id == "retry-42")
            .group_by(UsageRow.tenant_id)
        ).all()
    assert sorted(n for _, n in rows) == [1, 2]


@pytest.mark.parametrize(
    "value",
    [
        "a" * 129,  # too long
        "two words",  # a space
        "tab\tinside",
        "caf\xe9",  # not ASCII (sent as latin-1)
        'fake\\n{"level":"ERROR"}',  # visible ASCII: kept, and escaped in the log
    ],
)
def test_hostile_client_ids(gateway: LiveGateway, key: str, value: str) -> None:
    r = post(gateway, key, CHAT, **{"x-request-id": value.encode("latin-1")})
    assert r.status_code == 200
    own = r.headers[OWN]
    [record] = records(gateway, own)
    if value.startswith("fake"):
        assert r.headers["x-request-id"] == value == record.client_request_id
    else:  # ignored: the answer names the gateway's id
        assert r.headers["x-request-id"] == own and record.client_request_id is None
    # Every line is still one JSON object; the id is a value in it, never a line of its own.
    lines = log_lines(gateway)
    assert not [line for line in lines if line.get("level") == "ERROR"]
    if value.startswith("fake"):
        assert [line for line in lines if line.get("client_request_id") == value]


def test_control_characters_never_reach_a_header_or_a_log(gateway: LiveGateway, key: str) -> None:
    host, port = gateway.base_url.removeprefix("http://").split(":")
    body = json.dumps({"model": gateway.model, **CHAT}).encode()
    raw = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {key}\r\n".encode()
        + b"x-request-id: bad\x01\x7fid\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head = reply.split(b"\r\n\r\n", 1)[0]
    assert b"\x01" not in head and b"\x7f" not in head
    status = int(head.split(b" ", 2)[1])
    assert status in (200, 400), head  # the HTTP parser may refuse the header itself
    if status == 200:
        ids = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
        assert ids[b"x-request-id"] == ids[OWN.encode()]
    assert not [line for line in log_lines(gateway) if "bad" in line.get("client_request_id", "")]
