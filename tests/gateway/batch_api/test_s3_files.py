"""Batch API files in an S3-compatible bucket (issue 42 item 2), against a real S3 HTTP
server (moto's, in-process): bodies round-trip byte for byte under <prefix>/<tenant>/<id>,
a tenant reaches only its own, a batch reads its input and writes its output there, a
bucket that cannot be used is refused at start, and a store that stops answers 503.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from openai import NotFoundError, OpenAI
from pydantic import ValidationError

from server.settings import Settings
from tenancy.models import ApiKey, Tenant
from tests.gateway.batch_api.moto_s3 import SECRET_ACCESS_KEY, MotoS3
from tests.utils.batch_server import BatchServer, api_error, batch_body, chat_line
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER

PREFIX = "tenants-files"


@pytest.fixture
def s3() -> Iterator[MotoS3]:
    """A fresh bucket on a moto S3 server of this test's own."""
    server = MotoS3()
    yield server
    server.stop()


def _tenant_id(server: BatchServer, name: str) -> str:
    with server.sessions() as s:
        return str(s.scalar(sa.select(Tenant.id).where(Tenant.name == name)))


def _sdk(server: BatchServer, tenant: str) -> OpenAI:
    """The official openai SDK over the app (TestClient is an httpx client)."""
    return OpenAI(
        base_url="http://testserver/v1",
        api_key=server.keys[tenant],
        http_client=server.client,
        max_retries=0,
    )


def _local_bodies(data_dir: Path) -> list[Path]:
    """Files kept under the data directory's files folder (staging aside)."""
    root = data_dir / "files"
    if not root.exists():
        return []
    return [p for p in root.rglob("*") if p.is_file() and ".staging" not in p.parts]


def test_files_round_trip_through_the_bucket_under_the_tenants_prefix(
    batch_server: Callable[..., BatchServer], s3: MotoS3
) -> None:
    server = batch_server({"acme": {}, "rival": {}}, **s3.settings())
    acme = _sdk(server, "acme")
    # Every byte value, and past boto3's 8 MiB multipart threshold.
    line = bytes(range(256)) * 8 + b"\n"
    content = line * (9 * 1024 * 1024 // len(line) + 1)
    uploaded = acme.files.create(file=("input.jsonl", content), purpose="batch")
    assert uploaded.bytes == len(content)
    key = f"{PREFIX}/{_tenant_id(server, 'acme')}/{uploaded.id}"
    assert s3.keys() == {key}
    assert s3.body(key) == content
    assert _local_bodies(server.data_dir) == []  # nothing kept on the gateway's disk
    assert [f.id for f in acme.files.list()] == [uploaded.id]
    assert acme.files.content(uploaded.id).content == content
    # Another tenant: 404 for every verb, and the object stays.
    rival = _sdk(server, "rival")
    for call in (rival.files.retrieve, rival.files.content, rival.files.delete):
        with pytest.raises(NotFoundError):
            call(uploaded.id)
    assert s3.keys() == {key}
    assert acme.files.delete(uploaded.id).deleted is True
    assert s3.keys() == set()
    with pytest.raises(NotFoundError):
        acme.files.content(uploaded.id)


def test_a_batch_reads_its_input_and_writes_its_output_in_the_bucket(
    batch_server: Callable[..., BatchServer], s3: MotoS3
) -> None:
    server = batch_server({"acme": {}}, **s3.settings())
    acme = _sdk(server, "acme")
    content = b"".join(chat_line(f"req-{i}", f"question {i}") for i in range(12))
    content += b"{not json\n"
    uploaded = acme.files.create(file=("input.jsonl", content), purpose="batch")
    batch = acme.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = server.wait_batch("acme", batch.id)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 13, "completed": 12, "failed": 1}
    tenant = _tenant_id(server, "acme")
    output_id, error_id = done["output_file_id"], done["error_file_id"]
    assert s3.keys() == {f"{PREFIX}/{tenant}/{i}" for i in (uploaded.id, output_id, error_id)}
    out = [json.loads(line) for line in acme.files.content(output_id).content.splitlines()]
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(12))
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert acme.files.content(output_id).content == s3.body(f"{PREFIX}/{tenant}/{output_id}")
    errors = [json.loads(line) for line in acme.files.content(error_id).content.splitlines()]
    assert [e["error"]["code"] for e in errors] == ["invalid_json_line"]
    assert _local_bodies(server.data_dir) == []


def test_a_stopped_store_is_a_503_for_files_and_the_metadata_stays(
    batch_server: Callable[..., BatchServer], s3: MotoS3
) -> None:
    server = batch_server({"acme": {}}, **s3.settings())
    kept = server.upload("acme", chat_line("a", "hello")).json()["id"]
    s3.stop()
    c, headers = server.client, server.headers("acme")
    refusals = [
        server.upload("acme", chat_line("b", "hello")),
        c.get(f"/v1/files/{kept}/content", headers=headers),
        c.delete(f"/v1/files/{kept}", headers=headers),
        c.post("/v1/batches", json=batch_body(kept), headers=headers),
    ]
    for r in refusals:
        error = api_error(r, 503)
        assert error["code"] == "file_store_unavailable" and error["type"] == "service_unavailable"
        assert SECRET_ACCESS_KEY not in r.text
    # What the database holds still answers; nothing was half deleted or half added.
    listed = c.get("/v1/files", headers=headers).json()["data"]
    assert [f["id"] for f in listed] == [kept]
    assert list((server.data_dir / "files" / ".staging").iterdir()) == []
    s3.start()  # the same port, the same objects
    r = c.get(f"/v1/files/{kept}/content", headers=headers)
    assert r.status_code == 200 and r.content == chat_line("a", "hello")


def test_a_batch_whose_store_is_down_waits_and_resumes_when_it_is_back(
    batch_server: Callable[..., BatchServer], s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    server = batch_server({"acme": {}}, **s3.settings(), batch_lease_s=5.0)
    content = b"".join(chat_line(f"req-{i}", f"question {i}") for i in range(5))
    file_id = server.upload("acme", content).json()["id"]
    api = server.app.state.cloister.batch_api
    with server.sessions() as s:
        tenant, key_id = s.execute(
            sa.select(Tenant.id, ApiKey.id).join(ApiKey, ApiKey.tenant_id == Tenant.id)
        ).one()
    s3.stop()
    # A batch left in progress (as by a server that stopped) while the store is down.
    batch = api.batches.create(
        tenant_id=tenant,
        key_id=key_id,
        endpoint="/v1/chat/completions",
        input_file_id=file_id,
        completion_window="24h",
        metadata=None,
        total_lines=5,
        estimated_tokens=100,
        max_queued_tokens=10**9,
    )
    with caplog.at_level(logging.WARNING, logger="cloister.batches"):
        deadline = time.monotonic() + 10  # the runner finds it at its next poll (2 s)
        while not any("batch paused" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    paused = next(r.getMessage() for r in caplog.records if "batch paused" in r.getMessage())
    assert "file store is unavailable" in paused and SECRET_ACCESS_KEY not in paused
    waiting = server.client.get(f"/v1/batches/{batch.id}", headers=server.headers("acme"))
    assert waiting.json()["status"] == "in_progress"
    assert waiting.json()["request_counts"]["completed"] == 0
    s3.start()
    done = server.wait_batch("acme", batch.id)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    out = server.lines_of("acme", done["output_file_id"])
    assert sorted(line["custom_id"] for line in out) == [f"req-{i}" for i in range(5)]


def test_a_batch_whose_output_cannot_be_written_finalizes_once_the_store_is_back(
    batch_server: Callable[..., BatchServer], s3: MotoS3
) -> None:
    # Each line takes about 0.2 s, one at a time: the store stops while lines run.
    engine = gateway_test_engine(compute_s=0.05)
    server = batch_server({"acme": {}}, engine=engine, batch_concurrency=1, **s3.settings())
    content = b"".join(chat_line(f"req-{i}", f"question {i}") for i in range(4))
    file_id = server.upload("acme", content).json()["id"]
    r = server.create_batch("acme", file_id)
    batch_id = r.json()["id"]

    def wait_completed(lines: int) -> None:
        deadline = time.monotonic() + 20
        while True:
            got = server.client.get(f"/v1/batches/{batch_id}", headers=server.headers("acme"))
            if got.json()["request_counts"]["completed"] >= lines:
                return
            assert time.monotonic() < deadline, got.json()
            time.sleep(0.02)

    wait_completed(1)  # the input was read; the store stops while the other lines run
    s3.stop()
    wait_completed(4)
    time.sleep(2.5)  # a finalization tried against the stopped store
    batch = server.client.get(f"/v1/batches/{batch_id}", headers=server.headers("acme")).json()
    assert batch["status"] == "finalizing" and batch["output_file_id"] is None
    s3.start()
    done = server.wait_batch("acme", batch_id)
    assert done["status"] == "completed", done
    out = server.lines_of("acme", done["output_file_id"])
    assert sorted(line["custom_id"] for line in out) == [f"req-{i}" for i in range(4)]


def _run_server(tmp_path: Path, **values: Any) -> click.ClickException:
    """`cloister serve`'s start on the fast fake engine with these settings; its refusal."""
    from cloister.commands.serve import run_server

    settings = Settings(data_dir=tmp_path / "data", key_pepper=PEPPER, model_name="fake", **values)
    with pytest.raises(click.ClickException) as caught:
        run_server(settings, engine=gateway_test_engine())
    return caught.value


def test_a_bucket_that_cannot_be_used_is_refused_at_start_in_one_line(
    tmp_path: Path, s3: MotoS3
) -> None:
    missing = _run_server(tmp_path, **s3.settings(files_s3_bucket="no-such-bucket"))
    message = missing.format_message()
    assert "\n" not in message and SECRET_ACCESS_KEY not in message
    assert "'no-such-bucket'" in message and s3.endpoint_url in message
    assert "does not exist" in message
    s3.stop()
    down = _run_server(tmp_path, **s3.settings()).format_message()
    assert "\n" not in down and SECRET_ACCESS_KEY not in down
    assert f"'{s3.bucket}'" in down and s3.endpoint_url in down and "cannot be reached" in down


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"files_s3_endpoint_url": "not a url"}, "http:// or https:// URL"),
        ({"files_s3_endpoint_url": "ftp://minio:9000"}, "http:// or https:// URL"),
        ({"files_s3_endpoint_url": "http://minio:99999"}, "http:// or https:// URL"),
        ({"files_s3_endpoint_url": "http://ak:sk@minio:9000"}, "must not hold credentials"),
        ({"files_s3_bucket": "Bad_Bucket!"}, "not an S3 bucket name"),
        ({"files_s3_prefix": "a/../b"}, "no '..'"),
        ({"files_s3_access_key_id": "only-the-id"}, "FILES_S3_BUCKET must be set"),
        (
            {"files_s3_bucket": "ok-bucket", "files_s3_access_key_id": "only-the-id"},
            "set both",
        ),
    ],
)
def test_object_store_settings_that_cannot_work_are_refused(
    tmp_path: Path, values: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        Settings(data_dir=tmp_path, key_pepper=PEPPER, **values)


def test_cloister_serve_refuses_an_endpoint_that_is_not_a_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from cloister.commands import serve as serve_module

    reached: list[Settings] = []
    monkeypatch.setattr(serve_module, "run_server", reached.append)
    monkeypatch.setenv("CLOISTER_FILES_S3_BUCKET", "files")
    monkeypatch.setenv("CLOISTER_FILES_S3_ENDPOINT_URL", "minio 9000")
    result = CliRunner().invoke(serve_module.serve, ["--data-dir", str(tmp_path)])
    assert result.exit_code != 0 and reached == []
    assert "Traceback" not in result.output
    assert "files_s3_endpoint_url" in result.output and "http://" in result.output


def test_the_startup_summary_says_where_files_live(tmp_path: Path, s3: MotoS3) -> None:
    from assembly.startup_summary import build_summary

    in_bucket = Settings(data_dir=tmp_path, key_pepper=PEPPER, **s3.settings())
    text = build_summary(in_bucket, {}, {}).text()
    assert f"files      S3 bucket {s3.bucket} at {s3.endpoint_url}" in text
    assert f"keys {PREFIX}/<tenant>/<file id>" in text and SECRET_ACCESS_KEY not in text
    on_disk = Settings(data_dir=tmp_path, key_pepper=PEPPER)
    assert (
        f"data directory {(tmp_path / 'files').resolve()}" in build_summary(on_disk, {}, {}).text()
    )
