"""Raw usage past `usage_retention_days` is purged while billing stays whole: rollups,
statements and exports of the purged period are unchanged, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import ValidationError

from admin import registry
from admin.app import create_admin_app, make_services, with_audit_checkpoints
from admin.billing_export import build_statement, render_statement
from admin.models import AuditEvent, UsageHourly, UsageRow
from admin.settings import AdminSettings
from admin.usage_retention import UsageRetention
from admin.usage_store import write_usage
from cloister.cli import main
from cloister.commands.serve import load_settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv, make_env
from tests.utils.services import postgres_database

NOW = dt.datetime(2026, 6, 15, 12, 30, tzinfo=dt.UTC)
RETENTION_DAYS = 30
CUTOFF = dt.datetime(2026, 5, 16, 12, tzinfo=dt.UTC)  # the hour NOW - 30 days falls in
PRICES = registry.Prices(input=150_000, cached_input=75_000, output=600_000)
LATER_PRICES = registry.Prices(input=300_000, cached_input=100_000, output=900_000)
# "late" had no price until 10:20 one morning: that hour's statement is split by price.
LATE_PRICED_AT = dt.datetime(2026, 5, 1, 10, 20, tzinfo=dt.UTC)
# "priced" changed its price on the hour: no hour of it is split.
REPRICED_AT = dt.datetime(2026, 5, 5, 0, tzinfo=dt.UTC)
PERIODS = ("2026-04", "2026-05", "2026-05-01", "2026-05-16", "2026-06")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AdminEnv]:
    """An admin environment with tenants alpha and beta, on each kind of database."""
    if request.param == "sqlite":
        e = make_env(tmp_path)
        yield e
        e.client.close()
        return
    with postgres_database() as url:
        e = make_env(tmp_path, url)
        yield e
        e.client.close()


def _row(rid: str, tenant_id: str, model: str, when: dt.datetime, **more: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "occurred_at": when.isoformat(),
        "tenant_id": tenant_id,
        "key_id": "k1",
        "model": model,
        "adapter": "",
        "prompt_tokens": 120,
        "cached_tokens": 30,
        "completion_tokens": 45,
        "latency_s": 0.2,
        "status": 200,
        **more,
    }


def _usage(env: AdminEnv) -> tuple[set[str], set[str]]:
    """Writes a season of usage; returns the ids the purge must remove and must keep."""
    april = dt.datetime(2026, 4, 1, tzinfo=dt.UTC)
    with env.sessions() as s:
        alpha, beta = (store.get_tenant(s, n).id for n in ("alpha", "beta"))
        register_stand_in(s, "priced", prices=PRICES, now=april)
        registry.set_price(s, model="priced", prices=LATER_PRICES, effective_from=REPRICED_AT)
        register_stand_in(s, "late")
        registry.set_price(s, model="late", prices=PRICES, effective_from=LATE_PRICED_AT)
        old = [
            _row("apr-1", alpha, "priced", april + dt.timedelta(days=3, minutes=7)),
            _row("apr-2", beta, "priced", april + dt.timedelta(days=20), batch=True),
            _row("may-1", alpha, "priced", REPRICED_AT - dt.timedelta(minutes=5)),
            _row("may-2", alpha, "priced", REPRICED_AT + dt.timedelta(minutes=5)),
            _row("may-3", beta, "priced", REPRICED_AT + dt.timedelta(days=3), status=429),
            _row("late-0", alpha, "late", LATE_PRICED_AT - dt.timedelta(hours=1)),  # unpriced
            _row("edge", beta, "priced", CUTOFF - dt.timedelta(microseconds=1)),
        ]
        split_hour = [  # 10:00-11:00 on May 1: kept, the statement prices them one by one
            _row("late-1", alpha, "late", LATE_PRICED_AT - dt.timedelta(minutes=15)),
            _row("late-2", alpha, "late", LATE_PRICED_AT + dt.timedelta(minutes=5)),
            _row("late-3", beta, "late", LATE_PRICED_AT + dt.timedelta(minutes=30)),
        ]
        new = [
            _row("cut", alpha, "priced", CUTOFF),
            _row("jun-1", alpha, "late", NOW - dt.timedelta(days=2)),
            _row("jun-2", beta, "priced", NOW - dt.timedelta(minutes=1), batch=True),
        ]
        assert write_usage(s, [*old, *split_hour, *new]) == len(old + split_hour + new)
    return {r["request_id"] for r in old}, {r["request_id"] for r in split_hour + new}


def _billing(env: AdminEnv) -> dict[str, Any]:
    """Everything billing reads and finance receives: rollups, statements and exports."""
    with env.sessions() as s:
        rollups = sorted(tuple(r) for r in s.execute(sa.select(UsageHourly.__table__)).all())
        out: dict[str, Any] = {"rollups": rollups}
        for period in PERIODS:
            statement = build_statement(s, period=period)
            out[period] = (render_statement(statement, "csv"), render_statement(statement, "jsonl"))
    return out


def _raw_ids(env: AdminEnv) -> set[str]:
    with env.sessions() as s:
        return set(s.scalars(sa.select(UsageRow.request_id)))


def _purges(env: AdminEnv) -> list[dict[str, Any]]:
    """The detail of each usage.purge audit record, in order."""
    assert env.services.audit_writer.flush()
    with env.sessions() as s:
        rows = s.scalars(
            sa.select(AuditEvent).where(AuditEvent.action == "usage.purge").order_by(AuditEvent.seq)
        )
        return [{"actor": r.actor, "role": r.role, **(r.detail or {})} for r in rows]


def _retention(env: AdminEnv, **kw: Any) -> UsageRetention:
    return UsageRetention(
        env.sessions,
        retention_days=RETENTION_DAYS,
        audit=env.services.audit_writer,
        clock=lambda: NOW,
        **kw,
    )


def test_purge_removes_old_records_and_keeps_billing(env: AdminEnv) -> None:
    with env.sessions() as s:
        store.create_tenant(s, name="alpha")
        store.create_tenant(s, name="beta")
    purged, kept = _usage(env)
    before = _billing(env)
    assert before["2026-05-01"][0].count("\n") > 3  # the split hour bills at two prices

    retention = _retention(env)
    assert retention.cutoff() == CUTOFF
    deleted = retention.purge_once()
    assert _billing(env) == before  # rollups, statements and their exports unchanged
    assert _raw_ids(env) == kept
    assert deleted == len(purged)

    assert retention.purge_once() == 0  # idempotent: nothing left to purge
    assert _raw_ids(env) == kept
    assert _billing(env) == before
    # One audit record per purge that removed rows, with the count.
    assert _purges(env) == [
        {
            "actor": "system:retention",
            "role": "system",
            "deleted": len(purged),
            "before": CUTOFF.isoformat(),
            "retention_days": RETENTION_DAYS,
        }
    ]


def test_a_large_purge_goes_in_chunks_and_is_audited_once(env: AdminEnv) -> None:
    with env.sessions() as s:
        tenant = store.create_tenant(s, name="alpha").id
        old = CUTOFF - dt.timedelta(days=1)
        rows = [_row(f"r{i}", tenant, "m", old + dt.timedelta(minutes=i)) for i in range(7)]
        write_usage(s, [*rows, _row("new", tenant, "m", NOW)])
    assert _retention(env, chunk=2).purge_once() == 7
    assert _raw_ids(env) == {"new"}
    assert [p["deleted"] for p in _purges(env)] == [7]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_the_running_admin_app_purges_past_the_configured_retention(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = nullcontext(f"sqlite:///{tmp_path / 'served.db'}")
    with postgres_database() if kind == "postgresql" else served as url:
        monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("CLOISTER_DATABASE_URL", url)
        monkeypatch.setenv("CLOISTER_ADMIN_USAGE_RETENTION_DAYS", "30")
        settings = load_settings()
        upgrade_database(url)
        engine = make_engine(url)
        sessions = make_session_factory(engine)
        now = dt.datetime.now(dt.UTC)
        with sessions() as s:
            tenant = store.create_tenant(s, name="alpha").id
            write_usage(
                s,
                [
                    _row("40-days", tenant, "m", now - dt.timedelta(days=40)),  # kept at 90
                    _row("10-days", tenant, "m", now - dt.timedelta(days=10)),
                ],
            )
        services = make_services(
            sessions,
            pepper=settings.key_pepper.get_secret_value(),
            settings=AdminSettings.from_settings(settings),
        )
        app = with_audit_checkpoints(create_admin_app(services), services)
        with TestClient(app):
            deadline = time.monotonic() + 20
            while "40-days" in (ids := _ids(sessions)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ids == {"10-days"}
        with sessions() as s:  # the shutdown drained the audit writer
            details = s.scalars(
                sa.select(AuditEvent.detail).where(AuditEvent.action == "usage.purge")
            ).all()
        engine.dispose()
    assert [(d or {}).get("deleted") for d in details] == [1]


def _ids(sessions: Any) -> set[str]:
    with sessions() as s:
        return set(s.scalars(sa.select(UsageRow.request_id)))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "greater than or equal to 1"),
        ("-7", "greater than or equal to 1"),
        ("ninety", "a valid integer"),
        ("36501", "less than or equal to 36500"),
    ],
)
def test_a_bad_retention_stops_the_server(
    value: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_ADMIN_USAGE_RETENTION_DAYS", value)
    with pytest.raises(click.ClickException) as refused:  # cloister serve
        load_settings()
    assert f"admin_usage_retention_days: Input should be {message}" in refused.value.message
    served = CliRunner().invoke(main, ["admin", "serve"])  # cloister admin serve
    assert served.exit_code != 0
    assert "admin_usage_retention_days" in served.output and message in served.output


@pytest.mark.parametrize("value", [0, -1])
def test_admin_settings_refuse_a_retention_under_a_day(value: int) -> None:
    with pytest.raises(ValidationError, match="usage_retention_days"):
        AdminSettings(usage_retention_days=value)


@pytest.mark.parametrize("value", [0, -1, "90", 2.5, True])
def test_the_purge_refuses_a_retention_that_is_no_number_of_days(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="retention_days"):
        UsageRetention(None, retention_days=value, audit=None)  # type: ignore[arg-type]
