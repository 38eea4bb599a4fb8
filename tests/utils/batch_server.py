"""A Batch API client over a live `cloister serve` app: a tenant's uploads, batch polling and
file lines read back through the API, and input lines for /v1/chat/completions."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient


@dataclass
class BatchServer:
    """A live app, its client, the tenants' keys and a session factory on its database."""

    app: FastAPI
    client: TestClient
    keys: dict[str, str]
    sessions: Any
    data_dir: Path

    def headers(self, tenant: str) -> dict[str, str]:
        """The bearer header of `tenant`'s key."""
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def upload(self, tenant: str, content: bytes, *, purpose: str = "batch") -> Any:
        """POSTs a file as the openai SDK does (multipart: file + purpose)."""
        return self.client.post(
            "/v1/files",
            headers=self.headers(tenant),
            files={"file": ("input.jsonl", content, "application/jsonl")},
            data={"purpose": purpose},
        )

    def create_batch(self, tenant: str, file_id: str, **extra: Any) -> Any:
        """POSTs `batch_body(file_id, **extra)` to /v1/batches as `tenant`; the response."""
        return self.client.post(
            "/v1/batches", json=batch_body(file_id, **extra), headers=self.headers(tenant)
        )

    def wait_batch(self, tenant: str, batch_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Polls the batch until it ends; its last object."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.client.get(f"/v1/batches/{batch_id}", headers=self.headers(tenant))
            assert r.status_code == 200, r.text
            batch: dict[str, Any] = r.json()
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return batch
            assert time.monotonic() < deadline, batch
            time.sleep(0.05)

    def lines_of(self, tenant: str, file_id: str) -> list[dict[str, Any]]:
        """The JSON lines of a file, read through the API."""
        r = self.client.get(f"/v1/files/{file_id}/content", headers=self.headers(tenant))
        assert r.status_code == 200, r.text
        return [json.loads(line) for line in r.content.splitlines() if line.strip()]


def batch_body(file_id: str, **extra: Any) -> dict[str, Any]:
    """The body that creates a 24h batch of `file_id` on /v1/chat/completions; `extra`
    adds or replaces fields."""
    body: dict[str, Any] = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return {**body, **extra}


def api_error(r: Any, status: int) -> dict[str, Any]:
    """Asserts that `r` is a `status` in OpenAI's error shape (a message and nothing
    else but type, param and code); returns the error object."""
    assert r.status_code == status, (r.status_code, r.text)
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def chat_line(custom_id: str, text: str, **body: Any) -> bytes:
    """One input line for /v1/chat/completions."""
    request = {"model": "fake", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    request.update(body)
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": request,
    }
    return json.dumps(line).encode() + b"\n"
