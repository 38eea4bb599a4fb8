"""The openai SDK's `files` and `batches` against a live `cloister serve`, and a batch that
survives `kill -9` (issue 42 item 2): after the restart every line appears exactly once
in the output, and each line has exactly one usage record."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from openai import OpenAI

from admin.models import UsageRow
from tests.gateway.processes import GatewayProcess, create_tenant_key, database, running_gateway
from tests.utils.batch_server import chat_line
from tests.utils.tiny_model import make_tiny_model_dir

LINES = 200  # the first batch's lines
KILLED_LINES = 100  # the batch killed mid-way


def _client(gw: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def _wait(client: OpenAI, batch_id: str, timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)


def _input(max_tokens: int, lines: int = LINES) -> bytes:
    rows = [
        chat_line(
            f"line-{i}", f"tell me about {i}", model="tiny", max_tokens=max_tokens, temperature=0
        )
        for i in range(lines)
    ]
    return b"".join(rows)


@pytest.mark.slow
def test_the_sdk_runs_a_batch_that_survives_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sessions = database(data)
    key = create_tenant_key(sessions, "acme")
    model = make_tiny_model_dir(tmp_path)
    with running_gateway(
        data, model, tmp_path / "first.log", batch_concurrency=4, batch_lease_s=5
    ) as gw:
        client = _client(gw, key)
        # A whole batch through the SDK, unchanged.
        upload = client.files.create(file=("in.jsonl", io.BytesIO(_input(2))), purpose="batch")
        assert upload.purpose == "batch" and upload.filename == "in.jsonl"
        assert [f.id for f in client.files.list()] == [upload.id]
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = _wait(client, batch.id, 240)
        assert done.status == "completed", done  # type: ignore[attr-defined]
        assert done.request_counts.completed == LINES  # type: ignore[attr-defined]
        output = client.files.content(done.output_file_id).text  # type: ignore[attr-defined]
        lines = [json.loads(line) for line in output.splitlines()]
        assert sorted(line["custom_id"] for line in lines) == sorted(
            f"line-{i}" for i in range(LINES)
        )
        assert all(line["response"]["body"]["model"] == "tiny" for line in lines)
        assert batch.id in [b.id for b in client.batches.list()]
        # A second batch, killed mid-way.
        upload = client.files.create(
            file=("slow.jsonl", io.BytesIO(_input(32, KILLED_LINES))), purpose="batch"
        )
        slow = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 240
        seen = 0
        while seen < 20:
            assert time.monotonic() < deadline
            time.sleep(0.2)
            seen = client.batches.retrieve(slow.id).request_counts.completed  # type: ignore[union-attr]
        os.kill(gw.proc.pid, signal.SIGKILL)
        print(f"killed with {seen} of {KILLED_LINES} lines done")
        assert seen < KILLED_LINES  # killed mid-batch
        gw.proc.wait(timeout=30)
    with running_gateway(
        data, model, tmp_path / "second.log", batch_concurrency=4, batch_lease_s=5
    ) as again:
        client = _client(again, key)
        done = _wait(client, slow.id, 300)
        assert done.status == "completed", done  # type: ignore[attr-defined]
        assert done.request_counts.total == KILLED_LINES  # type: ignore[attr-defined]
        assert done.request_counts.completed == KILLED_LINES  # type: ignore[attr-defined]
        output = client.files.content(done.output_file_id).text  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in output.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(
        f"line-{i}" for i in range(KILLED_LINES)
    )
    stem = slow.id.removeprefix("batch_")
    with sessions() as s:
        rows = s.scalars(
            sa.select(UsageRow).where(UsageRow.request_id.like(f"batch_req_{stem}_%"))
        ).all()
    # One usage record per line (the request id is the line's), each flagged batch, and
    # the tokens billed are the tokens the output file holds (greedy lines).
    assert sorted(r.request_id for r in rows) == sorted(line["id"] for line in lines)
    assert all(r.batch for r in rows)
    billed = {r.request_id: r.completion_tokens for r in rows}
    delivered = {
        line["id"]: line["response"]["body"]["usage"]["completion_tokens"] for line in lines
    }
    assert billed == delivered
