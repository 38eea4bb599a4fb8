"""Client request ids in the usage store (SQLite and PostgreSQL's JSON path): one client
id on many records is kept every time, a replay still counts once, and rows spooled
before migration 0006 (no client id) still go in; the admin API finds them per tenant."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from admin.metering import usage_row
from admin.models import UsageHourly, UsageRow
from admin.usage_store import write_usage
from gateway.usage import UsageRecord
from tenancy.models import Tenant
from tests.utils.admin_db import migrated_engine, migrated_postgres
from tests.utils.admin_env import AdminEnv
from tests.utils.admin_seed import usage_record


def _record(request_id: str, tenant: str, client: str | None) -> UsageRecord:
    tokens = {"prompt_tokens": 5, "completion_tokens": 3}
    timings = {"ttft_s": 0.01, "latency_s": 0.1}
    return usage_record(
        request_id,
        tenant_id=tenant,
        finish_reason="length",
        client_request_id=client,
        **tokens,
        **timings,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """A migrated database of each kind."""
    if request.param == "sqlite":
        with migrated_engine(f"sqlite:///{tmp_path / 'u.db'}") as (_, sessions):
            yield sessions
        return
    with migrated_postgres() as (_, sessions):
        yield sessions


def test_one_client_id_on_many_records(sessions: sessionmaker[Session]) -> None:
    now = dt.datetime.now(dt.UTC)
    records = [
        _record("cmpl-1", "ten_a", "retry-9"),
        _record("cmpl-2", "ten_a", "retry-9"),  # the same tenant's retry
        _record("cmpl-3", "ten_b", "retry-9"),  # another tenant, the same id
        _record("cmpl-4", "ten_b", None),
    ]
    rows = [usage_row(r, now) for r in records]
    old = {**usage_row(_record("cmpl-5", "ten_a", None), now)}
    del old["client_request_id"]  # as spooled before migration 0006
    with sessions() as s:
        assert write_usage(s, [*rows, old]) == 5
        assert write_usage(s, rows) == 0  # a replay changes nothing
        stored = {
            r.request_id: (r.tenant_id, r.client_request_id) for r in s.scalars(sa.select(UsageRow))
        }
        requests = s.scalar(sa.select(sa.func.sum(UsageHourly.requests)))
    assert stored == {
        "cmpl-1": ("ten_a", "retry-9"),
        "cmpl-2": ("ten_a", "retry-9"),
        "cmpl-3": ("ten_b", "retry-9"),
        "cmpl-4": ("ten_b", None),
        "cmpl-5": ("ten_a", None),
    }
    assert requests == 5


def test_admin_finds_a_tenants_requests_by_client_id(env: AdminEnv) -> None:
    with env.sessions() as s:
        ids = {name: id_ for name, id_ in s.execute(sa.select(Tenant.name, Tenant.id))}
        alpha, beta = ids["alpha"], ids["beta"]
        now = dt.datetime.now(dt.UTC)
        rows = [
            usage_row(_record("cmpl-a1", alpha, "retry-1"), now),
            usage_row(_record("cmpl-a2", alpha, "retry-1"), now + dt.timedelta(seconds=1)),
            usage_row(_record("cmpl-b1", beta, "retry-1"), now),
        ]
        assert write_usage(s, rows) == 3
    url = "/admin/api/v1/usage/requests"
    admin = env.token("admin")
    found = env.client.get(
        url, params={"tenant_id": alpha, "client_request_id": "retry-1"}, headers=admin
    ).json()
    assert [r["request_id"] for r in found["items"]] == ["cmpl-a2", "cmpl-a1"]
    assert {r["client_request_id"] for r in found["items"]} == {"retry-1"}
    # Client ids are per tenant: no tenant, no answer.
    r = env.client.get(url, params={"client_request_id": "retry-1"}, headers=admin)
    assert r.status_code == 400
    # A tenant-admin sees its own tenant's records only.
    own = env.token("tenant-admin", tenant="beta")
    mine = env.client.get(url, params={"client_request_id": "retry-1"}, headers=own).json()
    assert [r["request_id"] for r in mine["items"]] == ["cmpl-b1"]
    other = env.client.get(
        url, params={"tenant_id": alpha, "client_request_id": "retry-1"}, headers=own
    )
    assert other.status_code == 404
