"""Batches run to completion through the gateway's own routes (issue 42 item 2).

Each line is served, metered and isolated like an interactive request of the tenant;
a malformed line becomes an error-file line and the others run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from admin.identity import create_admin_token
from admin.models import UsageRow
from cloister.cli import main
from tenancy import store
from tenancy.models import ApiKey
from tests.utils.batch_server import BatchServer, chat_line
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER


def _create(server: BatchServer, tenant: str, file_id: str, **extra: object) -> dict[str, object]:
    r = server.create_batch(tenant, file_id, **extra)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_batch_runs_every_line_once_and_meters_each_as_a_batch_line(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}})
    content = b"".join(chat_line(f"req-{i}", f"question {i}") for i in range(20))
    upload = server.upload("acme", content)
    assert upload.status_code == 200, upload.text
    assert upload.json()["purpose"] == "batch" and upload.json()["bytes"] == len(content)
    batch = _create(server, "acme", upload.json()["id"], metadata={"job": "nightly"})
    assert batch["status"] == "in_progress" and batch["metadata"] == {"job": "nightly"}
    done = server.wait_batch("acme", str(batch["id"]))
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert done["error_file_id"] is None
    out = server.lines_of("acme", done["output_file_id"])
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(20))
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert line["response"]["request_id"] == line["id"] == body["id"]
    # Usage: one record per line, under the line's id, flagged as batch.
    server.app.state.metering.flush()
    with server.sessions() as s:
        rows = s.scalars(sa.select(UsageRow).where(UsageRow.request_id.like("batch_req_%"))).all()
    assert sorted(r.request_id for r in rows) == sorted(line["id"] for line in out)
    assert all(r.batch for r in rows)
    assert sum(r.completion_tokens for r in rows) == done["usage"]["output_tokens"] > 0
    assert sum(r.prompt_tokens for r in rows) == done["usage"]["input_tokens"] > 0


def test_malformed_lines_go_to_the_error_file_and_the_rest_run(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}})
    content = b"".join(
        [
            chat_line("good-1", "hello"),
            b"{not json\n",
            b'{"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions", "body": {}}\n',
            b"\n",  # a blank line is skipped, not an error
            chat_line("bad-model", "hello", model="no-such-model"),
            chat_line("good-2", "world"),
        ]
    )
    batch = _create(server, "acme", server.upload("acme", content).json()["id"])
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    done = server.wait_batch("acme", str(batch["id"]))
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    out = server.lines_of("acme", done["output_file_id"])
    assert [line["custom_id"] for line in out] == ["good-1", "good-2"]
    errors = server.lines_of("acme", done["error_file_id"])
    assert [e["custom_id"] for e in errors] == [None, "wrong-url", "bad-model"]
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "invalid_json_line"
    assert errors[1]["error"]["code"] == "invalid_url"
    # A line the route refused carries the route's status and OpenAI error body.
    refused = errors[2]["response"]
    assert refused["status_code"] == 404 and errors[2]["error"] is None
    assert refused["body"]["error"]["code"] == "model_not_found"
    assert set(refused["body"]["error"]) == {"message", "type", "param", "code"}


def test_batch_lines_bypass_the_interactive_rate_limit_and_leave_it_untouched(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {"rpm": 2}})
    content = b"".join(chat_line(f"r{i}", "hi") for i in range(6))
    done = server.wait_batch(
        "acme", str(_create(server, "acme", server.upload("acme", content).json()["id"])["id"])
    )
    assert done["request_counts"]["completed"] == 6
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    statuses = [
        server.client.post(
            "/v1/chat/completions", json=body, headers=server.headers("acme")
        ).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]  # the batch's six lines took none of the two


def test_a_batch_line_runs_as_its_tenant_with_the_tenants_model_limits(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"narrow": {"allowed_models": ["other"]}})
    done = server.wait_batch(
        "narrow",
        str(
            _create(server, "narrow", server.upload("narrow", chat_line("x", "hi")).json()["id"])[
                "id"
            ]
        ),
    )
    assert done["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    [error] = server.lines_of("narrow", done["error_file_id"])
    assert error["response"]["status_code"] == 403


def test_cancel_stops_new_lines_and_a_cancelled_batch_keeps_what_ran(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}}, batch_concurrency=1)
    content = b"".join(chat_line(f"r{i}", "x", max_tokens=40) for i in range(200))
    batch = _create(server, "acme", server.upload("acme", content).json()["id"])
    r = server.client.post(f"/v1/batches/{batch['id']}/cancel", headers=server.headers("acme"))
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
    done = server.wait_batch("acme", str(batch["id"]))
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    counts = done["request_counts"]
    assert counts["total"] == 200 and counts["completed"] < 200
    again = server.client.post(f"/v1/batches/{batch['id']}/cancel", headers=server.headers("acme"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "batch_not_cancellable"


def test_the_admin_api_shows_each_tenants_batch_progress(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}, "other": {}})
    content = chat_line("ok", "hi") + b"{broken\n" + chat_line("ok2", "there")
    batch = _create(server, "acme", server.upload("acme", content).json()["id"])
    done = server.wait_batch("acme", str(batch["id"]))
    with server.sessions() as s:
        admin = create_admin_token(s, pepper=PEPPER, role="viewer").secret
    auth = {"Authorization": f"Bearer {admin}"}
    r = server.client.get("/admin/api/v1/tenants/acme/batches", headers=auth)
    assert r.status_code == 200, r.text
    [row] = r.json()["items"]
    assert row["id"] == batch["id"] and row["status"] == "completed"
    assert (row["total_lines"], row["completed_lines"], row["failed_lines"]) == (3, 2, 1)
    assert row["completion_tokens"] == done["usage"]["output_tokens"] > 0
    assert row["ended_at"] is not None and row["output_file_id"] == done["output_file_id"]
    other = server.client.get("/admin/api/v1/tenants/other/batches", headers=auth)
    assert other.json()["items"] == []
    bad = server.client.get("/admin/api/v1/tenants/acme/batches?limit=0", headers=auth)
    assert bad.status_code in (400, 422) and "error" in bad.json()


def test_lines_the_engine_refuses_as_overloaded_wait_and_run_later(
    batch_server: Callable[..., BatchServer],
) -> None:
    """An engine with one waiting slot refuses most of four concurrent lines (503): a batch
    fills spare capacity, so they are sent again, not failed."""
    engine = gateway_test_engine(max_waiting=1, compute_s=0.01)
    server = batch_server({"acme": {}}, engine=engine, batch_concurrency=4)
    content = b"".join(chat_line(f"r{i}", "x", max_tokens=8) for i in range(8))
    done = server.wait_batch(
        "acme", str(_create(server, "acme", server.upload("acme", content).json()["id"])["id"])
    )
    assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert done["error_file_id"] is None


def test_a_batch_whose_key_is_revoked_mid_way_fails_and_keeps_what_ran(
    batch_server: Callable[..., BatchServer],
) -> None:
    server = batch_server({"acme": {}}, batch_concurrency=1)
    content = b"".join(chat_line(f"r{i}", "x", max_tokens=40) for i in range(300))
    batch = _create(server, "acme", server.upload("acme", content).json()["id"])
    url = f"/v1/batches/{batch['id']}"
    while (
        server.client.get(url, headers=server.headers("acme")).json()["request_counts"]["completed"]
        < 1
    ):
        time.sleep(0.02)
    with server.sessions() as s:
        key_id = s.scalar(sa.select(ApiKey.id))
        server.keys["acme"] = store.create_key(s, tenant_name="acme", pepper=PEPPER).secret
        store.revoke_key(s, key_id=key_id)
    done = server.wait_batch("acme", str(batch["id"]))
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert done["errors"]["data"][0]["code"] == "key_revoked"
    ran = done["request_counts"]["completed"]
    assert 0 < ran < 300
    assert len(server.lines_of("acme", done["output_file_id"])) == ran


def test_the_cli_lists_a_tenants_batches(
    batch_server: Callable[..., BatchServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = batch_server({"acme": {}})
    content = chat_line("a", "hi") + chat_line("b", "there")
    batch = _create(server, "acme", server.upload("acme", content).json()["id"])
    server.wait_batch("acme", str(batch["id"]))
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(server.data_dir))
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", PEPPER)
    listed = CliRunner().invoke(main, ["batches", "list", "acme", "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert row["id"] == batch["id"] and row["status"] == "completed"
    assert (row["completed_lines"], row["total_lines"]) == (2, 2)
    text = CliRunner().invoke(main, ["batches", "list", "acme"])
    assert batch["id"] in text.output and "completed" in text.output
    missing = CliRunner().invoke(main, ["batches", "list", "nobody"])
    assert missing.exit_code == 1 and "no tenant named 'nobody'" in missing.output
