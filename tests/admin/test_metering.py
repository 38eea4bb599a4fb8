"""Metering: one record per request id, partial streams counted, nothing lost or doubled in outages."""

from __future__ import annotations

import datetime as dt
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from admin.metering import MeteringSink
from admin.models import UsageHourly, UsageRow
from admin.usage_store import write_usage
from gateway.usage import UsageGuard, UsageRecord
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.services import postgres_database


def _usage(i: int, completion: int, *, disconnected: bool = False) -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{i}",
        tenant_id="ten_a",
        key_id="key_a",
        model="m",
        prompt_tokens=10,
        cached_tokens=2,
        completion_tokens=completion,
        ttft_s=0.01,
        latency_s=0.1,
        status=200,
        finish_reason="abort" if disconnected else "length",
        client_disconnected=disconnected,
    )


def _sessions(tmp_path: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade_database(url)
    return make_session_factory(make_engine(url))


def _rows(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as s:
        return {r.request_id: r.completion_tokens for r in s.scalars(sa.select(UsageRow))}


def _rollup_completion(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(sa.select(sa.func.sum(UsageHourly.completion_tokens))) or 0)


def test_cut_streams_each_recorded_once_with_produced_tokens(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    sink = MeteringSink(sessions, tmp_path / "spool.jsonl", retry_s=0.05).start()
    rng = random.Random(7)
    produced = {}
    for i in range(200):
        cut = rng.randint(0, 64)  # the client hangs up after `cut` tokens
        produced[f"req-{i}"] = cut
        guard = UsageGuard(sink)
        guard.emit(_usage(i, cut, disconnected=cut < 64))
        guard.emit(_usage(i, 999))  # a second close of the same request is ignored
    sink.close()
    assert _rows(sessions) == produced
    assert _rollup_completion(sessions) == sum(produced.values())


class FlakySessions:
    """A session factory whose database 'goes away' while `down` is set."""

    def __init__(self, real: sessionmaker[Session]) -> None:
        self.real = real
        self.down = threading.Event()

    def __call__(self) -> Session:
        if self.down.is_set():
            raise OperationalError("connect", {}, Exception("database is down"))
        return self.real()


def test_outage_spools_and_replays_without_loss_or_duplicates(tmp_path: Path) -> None:
    real = _sessions(tmp_path)
    flaky = FlakySessions(real)
    sink = MeteringSink(flaky, tmp_path / "spool.jsonl", batch=16, retry_s=0.02).start()  # type: ignore[arg-type]
    expected = {}
    for i in range(600):
        if i == 150:
            flaky.down.set()
        if i == 450:
            flaky.down.clear()
        expected[f"req-{i}"] = i % 17
        sink.record(_usage(i, i % 17))
        if i % 50 == 0:  # let the writer run inside the outage window
            sink.flush()
    sink.flush()
    flaky.down.clear()
    assert sink.drain_spool()
    sink.close()
    assert sink.db_failures > 0
    assert _rows(real) == expected
    assert _rollup_completion(real) == sum(expected.values())
    # Replaying everything again (a lost acknowledgement) counts nothing twice.
    rows = [
        {**r, "occurred_at": dt.datetime.now(dt.UTC).isoformat()} for r in _spool_rows(expected)
    ]
    with real() as s:
        assert write_usage(s, rows) == 0
    assert _rollup_completion(real) == sum(expected.values())


def _spool_rows(expected: dict[str, int]) -> list[dict[str, Any]]:
    from admin.metering import usage_row

    now = dt.datetime.now(dt.UTC)
    return [usage_row(_usage(int(k.split("-")[1]), v), now) for k, v in expected.items()]


def test_spool_left_by_a_crashed_process_is_replayed_in_order(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    spool = tmp_path / "spool.jsonl"
    from admin.spool import UsageSpool

    UsageSpool(spool).append(_spool_rows({"req-1": 3, "req-2": 4}))
    with open(spool, "a") as f:
        f.write('{"request_id": "torn')  # an append interrupted by the crash
    sink = MeteringSink(sessions, spool, retry_s=0.02).start()
    sink.record(_usage(3, 5))
    sink.close()
    assert _rows(sessions) == {"req-1": 3, "req-2": 4, "req-3": 5}
    assert spool.read_text() == ""


@pytest.mark.services
def test_killing_postgres_connections_mid_burst(tmp_path: Path) -> None:
    with postgres_database() as url:
        upgrade_database(url)
        engine = make_engine(url)
        sessions = make_session_factory(engine)
        name = engine.url.database
        admin = sa.create_engine(engine.url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        sink = MeteringSink(sessions, tmp_path / "spool.jsonl", batch=8, retry_s=0.02).start()
        expected = {}
        try:
            for i in range(400):
                if i == 100:
                    with admin.connect() as c:  # refuse new connections, kill the open ones
                        c.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                        c.execute(
                            sa.text(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = :d AND pid <> pg_backend_pid()"
                            ),
                            {"d": name},
                        )
                if i == 300:
                    with admin.connect() as c:
                        c.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
                expected[f"req-{i}"] = i % 11
                sink.record(_usage(i, i % 11))
                if i % 50 == 0:
                    sink.flush()
            sink.flush()
            assert sink.drain_spool()
            sink.close()
            assert sink.db_failures > 0
            assert _rows(sessions) == expected
            assert _rollup_completion(sessions) == sum(expected.values())
        finally:
            with admin.connect() as c:
                c.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            engine.dispose()
            admin.dispose()
