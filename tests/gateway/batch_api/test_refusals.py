"""Hostile and malformed input to the Batch API: clear 4xx in OpenAI's error shape,
another tenant's ids answered 404 (and audited), oversized uploads refused before they
reach the disk (issue 42 item 2)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from admin.models import AuditEvent
from tenancy.models import Tenant
from tests.utils.batch_server import BatchServer, api_error, batch_body, chat_line


def _staged(data_dir: Path) -> list[Path]:
    staging = data_dir / "files" / ".staging"
    return list(staging.iterdir()) if staging.exists() else []


def test_another_tenants_files_and_batches_are_not_found_and_the_probe_is_audited(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}, "rival": {}})
    file_id = server.upload("acme", chat_line("a", "secret prompt")).json()["id"]
    batch = server.create_batch("acme", file_id).json()
    rival = server.headers("rival")
    c = server.client
    for r in (
        c.get(f"/v1/files/{file_id}", headers=rival),
        c.get(f"/v1/files/{file_id}/content", headers=rival),
        c.delete(f"/v1/files/{file_id}", headers=rival),
        c.get(f"/v1/batches/{batch['id']}", headers=rival),
        c.post(f"/v1/batches/{batch['id']}/cancel", headers=rival),
        c.post("/v1/batches", json=batch_body(file_id), headers=rival),
        c.get("/v1/files/file-doesnotexist", headers=rival),
    ):
        api_error(r, 404)
    assert c.get("/v1/files", headers=rival).json()["data"] == []
    assert c.get("/v1/batches", headers=rival).json()["data"] == []
    # The owner still has both.
    assert c.get(f"/v1/files/{file_id}", headers=server.headers("acme")).status_code == 200
    assert [
        b["id"] for b in c.get("/v1/batches", headers=server.headers("acme")).json()["data"]
    ] == [batch["id"]]
    server.app.state.admin_services.audit_writer.flush()
    with server.sessions() as s:
        events = s.scalars(sa.select(AuditEvent).where(AuditEvent.outcome == "denied:404")).all()
    with server.sessions() as s:
        rival_id = s.scalar(sa.select(Tenant.id).where(Tenant.name == "rival"))
    assert events and sum(int((e.detail or {}).get("count", 1)) for e in events) == 7
    assert {e.tenant_id for e in events} == {rival_id}


def test_unauthenticated_calls_are_401(batch_server: Callable[..., BatchServer]) -> None:
    server = batch_server({"acme": {}})
    for r in (
        server.client.get("/v1/files"),
        server.client.post("/v1/files", files={"file": ("a", b"x")}, data={"purpose": "batch"}),
        server.client.get("/v1/batches", headers={"Authorization": "Bearer sk-clo-" + "x" * 43}),
    ):
        api_error(r, 401)


def test_bad_uploads_are_refused_with_their_reason(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}})
    c, h = server.client, server.headers("acme")
    assert api_error(server.upload("acme", b"x", purpose="fine-tune"), 400)["param"] == "purpose"
    assert api_error(server.upload("acme", b""), 400)["param"] == "file"
    assert (
        api_error(c.post("/v1/files", json={"purpose": "batch"}, headers=h), 400)["param"] == "file"
    )
    no_file = c.post(
        "/v1/files", data={"purpose": "batch"}, files={"other": ("a", b"x")}, headers=h
    )
    assert api_error(no_file, 400)["param"] == "file"
    garbled = c.post(
        "/v1/files",
        content=b"--b\r\nnot a header\r\n\r\nzz",
        headers={**h, "content-type": "multipart/form-data; boundary=b"},
    )
    assert garbled.status_code == 400
    assert _staged(server.data_dir) == []


def test_a_file_over_the_line_cap_is_refused_while_it_streams(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}})
    error = api_error(server.upload("acme", b"{}\n" * 1_000_000), 413)
    assert error["code"] == "too_many_lines"
    assert _staged(server.data_dir) == []
    assert server.client.get("/v1/files", headers=server.headers("acme")).json()["data"] == []


def _raw_upload(
    server: BatchServer, chunks: Iterator[bytes], *, declared: int | None = None
) -> tuple[int, dict[str, Any], int]:
    """Sends an upload straight into the ASGI app (no client buffering the body): the
    status, the error body and how many chunks the app pulled."""
    pulled = 0
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    headers = [
        (b"authorization", f"Bearer {server.keys['acme']}".encode()),
        (b"content-type", b"multipart/form-data; boundary=b"),
    ]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "state": {},
    }
    asyncio.run(server.app(scope, receive, send))
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = json.loads(b"".join(m.get("body", b"") for m in messages[1:]))
    return int(start["status"]), body["error"], pulled


def _big_file() -> Iterator[bytes]:
    yield (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
    )
    for _ in range(2048):  # 2 GiB if it were all read
        yield b"x" * (1 << 20)


def test_an_oversized_upload_is_refused_while_it_streams(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}}, batch_max_file_bytes=4 * 1024 * 1024)
    status, error, pulled = _raw_upload(server, _big_file())
    assert status == 413 and error["code"] == "file_too_large"
    assert pulled <= 6  # refused once past 4 MiB, not after 2 GiB
    assert _staged(server.data_dir) == []
    tenant_dirs = [p for p in (server.data_dir / "files").iterdir() if p.name != ".staging"]
    assert tenant_dirs == []


def test_a_declared_2gb_upload_is_refused_before_a_byte_is_read(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}})
    status, error, pulled = _raw_upload(server, _big_file(), declared=2 * 1024**3)
    assert status == 413 and error["code"] == "file_too_large" and pulled == 0


def test_per_tenant_file_caps(batch_server: Callable[..., BatchServer]) -> None:
    server = batch_server({"acme": {}, "other": {}}, batch_max_files_per_tenant=2)
    assert server.upload("acme", chat_line("a", "x")).status_code == 200
    assert server.upload("acme", chat_line("a", "x")).status_code == 200
    assert (
        api_error(server.upload("acme", chat_line("a", "x")), 429)["code"] == "file_quota_exceeded"
    )
    assert server.upload("other", chat_line("a", "x")).status_code == 200  # its own cap
    first = server.client.get("/v1/files", headers=server.headers("acme")).json()["data"][0]["id"]
    assert server.client.delete(f"/v1/files/{first}", headers=server.headers("acme")).json() == {
        "id": first,
        "object": "file",
        "deleted": True,
    }
    assert server.upload("acme", chat_line("a", "x")).status_code == 200


def test_bad_batch_requests(batch_server: Callable[..., BatchServer]) -> None:
    server = batch_server({"acme": {}}, batch_max_queued_tokens=5_000)
    c, h = server.client, server.headers("acme")
    good = server.upload("acme", chat_line("a", "x")).json()["id"]
    dup = server.upload("acme", chat_line("a", "x") + chat_line("a", "y")).json()["id"]
    blank = server.upload("acme", b"\n\n").json()["id"]
    big = server.upload("acme", chat_line("a", "x", max_tokens=10_000)).json()["id"]

    def create(**body: Any) -> Any:
        return c.post("/v1/batches", json=batch_body(good, **body), headers=h)

    assert api_error(create(endpoint="/v1/embeddings"), 400)["param"] == "endpoint"
    assert api_error(create(completion_window="1h"), 400)["param"] == "completion_window"
    assert api_error(create(input_file_id="file-nope"), 404)["code"] == "file_not_found"
    assert api_error(create(metadata={f"k{i}": "v" for i in range(17)}), 400)["param"] == "metadata"
    assert api_error(create(surprise=1), 400)["param"] == "surprise"
    assert api_error(create(input_file_id=dup), 400)["code"] == "duplicate_custom_id"
    assert api_error(create(input_file_id=blank), 400)["param"] == "input_file_id"
    assert api_error(create(input_file_id=big), 429)["code"] == "batch_token_limit_exceeded"
    assert api_error(c.post("/v1/batches", content=b"{", headers=h), 400)
    assert api_error(c.get("/v1/batches?limit=0", headers=h), 400)["param"] == "limit"
    assert api_error(c.get("/v1/batches?limit=abc", headers=h), 400)["param"] == "limit"
    assert api_error(c.get("/v1/files?order=up", headers=h), 400)["param"] == "order"
    assert api_error(c.get("/v1/batches/batch_nope", headers=h), 404)["code"] == "batch_not_found"
    assert create().status_code == 200
