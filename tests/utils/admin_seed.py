"""Seeding an admin environment (tests/utils/admin_env.py) for tests: tenants, usage rows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from admin.usage_store import write_usage
from gateway.usage import UsageRecord
from tenancy import store
from tests.utils.admin_env import AdminEnv, make_env


def env_with_tenants(tmp_path: Path, *names: str) -> Iterator[AdminEnv]:
    """For a fixture to `yield from`: a fresh admin environment with tenants `names`,
    its client closed afterwards."""
    e = make_env(tmp_path)
    with e.sessions() as s:
        for name in names:
            store.create_tenant(s, name=name)
    yield e
    e.client.close()


def usage_row(tenant_id: str, when: dt.datetime | str, **fields: Any) -> dict[str, Any]:
    """A usage row as `write_usage` takes it: one served request of `tenant_id` at `when`
    (model "tiny", key "key_x", 10 prompt tokens of which 4 cached, 5 completion tokens,
    TTFT 0.1 s, 0.5 s in all); `fields` replace any of its columns."""
    row: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "occurred_at": when if isinstance(when, str) else when.isoformat(),
        "tenant_id": tenant_id,
        "key_id": "key_x",
        "model": "tiny",
        "adapter": "",
        "prompt_tokens": 10,
        "cached_tokens": 4,
        "completion_tokens": 5,
        "ttft_s": 0.1,
        "latency_s": 0.5,
        "status": 200,
        "finish_reason": "stop",
        "client_disconnected": False,
    }
    return {**row, **fields}


def seed_usage(env: AdminEnv, tenant: str, when: dt.datetime, **fields: Any) -> None:
    """Writes one `usage_row` (with `fields`) for the tenant named `tenant`."""
    with env.sessions() as s:
        write_usage(s, [usage_row(store.get_tenant(s, tenant).id, when, **fields)])


def usage_record(request_id: str, **fields: Any) -> UsageRecord:
    """A UsageRecord of one served request: tenant "ten_a", key "k", model "m", 10 prompt
    tokens (none cached) and 2 completion tokens, TTFT 0.1 s, 0.2 s in all, status 200,
    finished by "stop", no disconnect; `fields` replace any of its fields."""
    values: dict[str, Any] = {
        "tenant_id": "ten_a",
        "key_id": "k",
        "model": "m",
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "completion_tokens": 2,
        "ttft_s": 0.1,
        "latency_s": 0.2,
        "status": 200,
        "finish_reason": "stop",
        "client_disconnected": False,
    }
    return UsageRecord(request_id=request_id, **{**values, **fields})
