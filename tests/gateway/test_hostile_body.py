"""Hostile bodies: malformed JSON is a 400 on a kept-alive connection; the size cap holds early."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from starlette.requests import Request

from gateway.body import MAX_BODY_BYTES, BodyTooLargeError, read_body
from tests.utils.live_gateway import LiveGateway, started_gateway

MESSAGES = '[{"role": "user", "content": "hi"}]'
GOOD_CHAT = f'{{"model": "tiny", "messages": {MESSAGES}, "max_tokens": 2}}'.encode()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_BODIES: dict[str, tuple[str, bytes]] = {
    "surrogate in content": (
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    ),
    "low surrogate in content": (
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\uDC00"}]}',
    ),
    "surrogate in a content part": (
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", '
        b'"content": [{"type": "text", "text": "\\ud83d"}]}]}',
    ),
    "surrogate in prompt": ("/v1/completions", b'{"model": "tiny", "prompt": "x\\ud800"}'),
    "surrogate in a prompt list": (
        "/v1/completions",
        b'{"model": "tiny", "prompt": ["ok", "\\udbff"]}',
    ),
    "utf-8 encoded surrogate": ("/v1/completions", b'{"model": "tiny", "prompt": "\xed\xa0\x80"}'),
    "nested 1000 deep": (
        "/v1/chat/completions",
        f'{{"model": "tiny", "messages": {MESSAGES}, "metadata": {_nested(1000)}}}'.encode(),
    ),
    "nested 100000 deep": (
        "/v1/chat/completions",
        f'{{"model": "tiny", "messages": {MESSAGES}, "zzz": {_nested(100_000)}}}'.encode(),
    ),
    "messages nested 1000 deep": (
        "/v1/chat/completions",
        f'{{"model": "tiny", "messages": {_nested(1000)}}}'.encode(),
    ),
    "5000-digit max_tokens": (
        "/v1/chat/completions",
        f'{{"model": "tiny", "messages": {MESSAGES}, "max_tokens": {"9" * 5000}}}'.encode(),
    ),
    "surrogate in a response's input": (
        "/v1/responses",
        b'{"model": "tiny", "input": [{"role": "user", "content": "\\ud800"}]}',
    ),
    "a response's tool type nested 1000 deep": (
        "/v1/responses",
        f'{{"model": "tiny", "input": "hi", "tools": [{{"type": {_nested(1000)}}}]}}'.encode(),
    ),
    "a response's input part nested 1000 deep": (
        "/v1/responses",
        b'{"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_text", '
        + f'"text": {_nested(1000)}}}]}}]}}'.encode(),
    ),
    "5000-digit unknown field": (
        "/v1/completions",
        f'{{"model": "tiny", "prompt": "hi", "zzz": -{"1" * 5000}}}'.encode(),
    ),
}


def calls_on_one_connection(
    gw: LiveGateway, key: str, requests: list[tuple[str, bytes]]
) -> list[tuple[int, Any]]:
    """Sends each request on the same TCP connection; fails if the server closed it."""
    url = urlsplit(gw.base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    conn.connect()
    assert conn.sock is not None
    local = conn.sock.getsockname()
    out: list[tuple[int, Any]] = []
    try:
        for path, body in requests:
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            payload = json.loads(response.read())
            assert response.getheader("connection", "").lower() != "close", payload
            assert conn.sock is not None and conn.sock.getsockname() == local
            out.append((response.status, payload))
    finally:
        conn.close()
    return out


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveGateway, str]]:
    """One live gateway and one tenant key for the whole module (the cases share nothing)."""
    with started_gateway(tmp_path_factory.mktemp("hostile_body")) as gw:
        yield gw, gw.tenant("acme")


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_body_is_a_400_and_the_connection_lives_on(
    shared: tuple[LiveGateway, str], case: str
) -> None:
    gateway, key = shared
    (bad_status, err), (good_status, ok) = calls_on_one_connection(
        gateway, key, [BAD_BODIES[case], ("/v1/chat/completions", GOOD_CHAT)]
    )
    assert bad_status == 400, err
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["type"] == "invalid_request_error"
    assert good_status == 200, ok


def test_content_length_over_the_cap_is_413_before_the_body_is_read(
    shared: tuple[LiveGateway, str],
) -> None:
    gateway, key = shared
    url = urlsplit(gateway.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        # Claims a gigabyte and sends none of it: waiting for the body would time out.
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {key}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
    err = json.loads(rest)["error"]
    assert err["code"] == "body_too_large" and set(err) == {"message", "type", "param", "code"}


def _streamed_request(chunk: bytes, chunks: int, headers: list[tuple[bytes, bytes]]) -> Any:
    sent = [0]

    async def receive() -> dict[str, Any]:
        sent[0] += 1
        return {"type": "http.request", "body": chunk, "more_body": sent[0] < chunks}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive), sent


def test_streamed_body_is_cut_off_at_the_cap() -> None:
    mib = b"x" * (1 << 20)
    request, sent = _streamed_request(mib, 64, [(b"transfer-encoding", b"chunked")])
    with pytest.raises(BodyTooLargeError) as err:
        asyncio.run(read_body(request))
    assert err.value.status == 413
    # Reading stopped at the first chunk past the cap, not at the end of the 64 MiB.
    assert sent[0] == MAX_BODY_BYTES // len(mib) + 1


def test_lying_small_content_length_does_not_lift_the_cap() -> None:
    mib = b"x" * (1 << 20)
    request, sent = _streamed_request(mib, 64, [(b"content-length", b"10")])
    with pytest.raises(BodyTooLargeError):
        asyncio.run(read_body(request))
    assert sent[0] == MAX_BODY_BYTES // len(mib) + 1


def test_body_under_the_cap_is_read_whole() -> None:
    request, _ = _streamed_request(b"{}", 3, [])
    assert asyncio.run(read_body(request)) == b"{}{}{}"


@pytest.mark.parametrize(
    "authorization", [b"Bearer ses.abc.\xe9", b"Bearer sk-clo-\xe9\xe9\xe9\xe9" + b"a" * 40]
)
def test_non_ascii_bearer_is_a_401_on_a_live_connection(
    shared: tuple[LiveGateway, str], authorization: bytes
) -> None:
    gateway, key = shared
    url = urlsplit(gateway.base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Authorization", authorization)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(GOOD_CHAT)))
        conn.endheaders(GOOD_CHAT)
        r = conn.getresponse()
        err = json.loads(r.read())["error"]
        assert r.status == 401 and err["code"] == "invalid_api_key", err
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=GOOD_CHAT,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        assert conn.getresponse().status == 200
    finally:
        conn.close()


@pytest.mark.parametrize("declared", [b"\xb2", b"-1", b"1e3", b"\xd9\xa3"])
def test_content_length_that_is_not_a_number_is_a_400(declared: bytes) -> None:
    from gateway.errors import InvalidParameterError

    request, _ = _streamed_request(b"{}", 1, [(b"content-length", declared)])
    with pytest.raises(InvalidParameterError):
        asyncio.run(read_body(request))
