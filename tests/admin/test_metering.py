"""Metering: one record per request id, partial streams counted, nothing lost or doubled in outages."""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.metering import MeteringSink, usage_row
from admin.models import UsageHourly, UsageRow
from admin.usage_store import ROLLUP_SUMS, write_usage
from gateway.usage import UsageGuard, UsageRecord
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_db import migrated_engine, migrated_postgres, migrated_sessions
from tests.utils.admin_seed import usage_record
from tests.utils.services import postgres_database


def _usage(i: int, completion: int, *, disconnected: bool = False) -> UsageRecord:
    return usage_record(
        f"req-{i}",
        key_id="key_a",
        cached_tokens=2,
        completion_tokens=completion,
        ttft_s=0.01,
        latency_s=0.1,
        finish_reason="abort" if disconnected else "length",
        client_disconnected=disconnected,
    )


def _sessions(tmp_path: Path) -> sessionmaker[Session]:
    return migrated_sessions(tmp_path / "m.db")


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
    with migrated_postgres() as (engine, sessions):
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
            admin.dispose()


@contextlib.contextmanager
def _database(kind: str, tmp_path: Path) -> Iterator[tuple[sa.Engine, sessionmaker[Session]]]:
    """A migrated database of `kind` with model "m" priced at P: its engine and sessions."""
    with contextlib.ExitStack() as stack:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'w.db'}"
        else:
            url = stack.enter_context(postgres_database())
        engine, sessions = stack.enter_context(migrated_engine(url))
        with sessions() as s:
            register_stand_in(s, "m", prices=P, now=T0)
        yield engine, sessions


P = registry.Prices(input=150_000, cached_input=75_000, output=600_000)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)]


def _row(i: int, *, when: dt.datetime, **changes: Any) -> dict[str, Any]:
    record = _usage(i, i % 13)
    # Every fifth row a batch line: rolled up apart from the interactive rows of its hour.
    row = {**usage_row(record, when), "tenant_id": f"ten_{i % 3}", "batch": i % 5 == 0}
    return {**row, **changes}


def _hourly(engine: sa.Engine) -> dict[tuple[Any, ...], tuple[int, ...]]:
    with engine.connect() as c:
        rows = c.execute(sa.select(UsageHourly.__table__)).all()
    # (hour, tenant, key, model, adapter, status, batch)
    return {tuple(r[:7]): tuple(r[7:]) for r in rows}


def _hourly_from_raw(engine: sa.Engine) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """The rollups recomputed from usage_records (what write_usage must have kept)."""
    out: dict[tuple[Any, ...], list[int]] = {}
    with engine.connect() as c:
        for r in c.execute(sa.select(UsageRow.__table__)).mappings():
            key = (
                r["occurred_at"].replace(minute=0, second=0, microsecond=0),
                r["tenant_id"],
                r["key_id"],
                r["model"],
                r["adapter"],
                r["status"],
                r["batch"],
            )
            sums = out.setdefault(key, [0, 0, 0, 0, 0, 0])
            sums[0] += 1
            for i, name in enumerate(ROLLUP_SUMS, 1):
                sums[i] += r[name]
            sums[-1] += int(r["unpriced"])  # usage_hourly.unpriced_requests
    return {k: tuple(v) for k, v in out.items()}


@pytest.mark.parametrize("kind", DATABASES)
def test_write_usage_counts_only_new_rows_and_keeps_rollups_exact(
    kind: str, tmp_path: Path
) -> None:
    with _database(kind, tmp_path) as (engine, sessions):
        hours = [T0 + dt.timedelta(minutes=25 * i) for i in range(6)]
        batch = [_row(i, when=hours[i % 6]) for i in range(40)]
        batch[5] = {**batch[5], "adapter": "lora-x", "ttft_s": None, "finish_reason": None}
        del batch[6]["adapter"]  # a spool row written before adapters existed
        del batch[8]["batch"]  # one written before batch lines existed
        with sessions() as s:
            assert write_usage(s, batch) == 40
        after_first = _hourly(engine)
        assert after_first == _hourly_from_raw(engine)
        assert {key[6] for key in after_first} == {False, True}  # batch rolled up apart
        assert sum(v[0] for v in after_first.values()) == 40
        # A replay, a batch that repeats an id, and a batch that mixes old and new rows.
        with sessions() as s:
            assert write_usage(s, batch[::-1]) == 0
        assert _hourly(engine) == after_first
        fresh = [_row(i, when=hours[i % 6]) for i in range(40, 50)]
        with sessions() as s:
            assert write_usage(s, [fresh[0], fresh[0], *batch[:3], *fresh[1:]]) == 10
        assert _hourly(engine) == _hourly_from_raw(engine)
        assert sum(v[0] for v in _hourly(engine).values()) == 50
        with sessions() as s, pytest.raises(ValueError, match="naive"):
            write_usage(s, [_row(99, when=T0, occurred_at="2026-01-01T00:00:00")])
        with engine.connect() as c:
            stored = {r.request_id: r for r in c.execute(sa.select(UsageRow.__table__)).all()}
        assert stored["req-5"].adapter == "lora-x"
        assert stored["req-5"].ttft_s is None and stored["req-5"].finish_reason is None
        assert stored["req-6"].adapter == ""
        assert stored["req-7"].occurred_at == hours[1]
        assert stored["req-7"].cost_pico_usd == P.cost_pico_usd(
            prompt_tokens=10, cached_tokens=2, completion_tokens=7
        )
        assert not stored["req-7"].batch and not stored["req-8"].batch
        # A batch line: half (the default discount) of what it would cost interactively.
        assert stored["req-10"].batch
        assert stored["req-10"].cost_pico_usd == P.cost_pico_usd(
            prompt_tokens=10, cached_tokens=2, completion_tokens=10, batch=True
        )
        assert stored["req-10"].cost_pico_usd * 2 == P.cost_pico_usd(
            prompt_tokens=10, cached_tokens=2, completion_tokens=10
        )


@pytest.mark.parametrize("kind", DATABASES)
def test_write_usage_statements_compile_once_whatever_the_batch_size(
    kind: str, tmp_path: Path
) -> None:
    with _database(kind, tmp_path) as (engine, sessions):
        # The first batches compile the price select, the insert and the upsert, once for
        # one parameter set and once for many (SQLite executes those differently).
        with sessions() as s:
            write_usage(s, [_row(0, when=T0)])
        with sessions() as s:
            write_usage(s, [_row(1, when=T0), _row(2, when=T0)])
        seen: list[tuple[str, object]] = []

        def record(
            conn: Any, cursor: Any, text: str, params: Any, context: Any, many: bool
        ) -> None:
            seen.append((text, context.cache_hit))

        sa.event.listen(engine, "after_cursor_execute", record)
        n = 3
        for size in (1, 7, 50, 3, 256, 50):
            with sessions() as s:
                assert write_usage(s, [_row(n + i, when=T0) for i in range(size)]) == size
            n += size
        assert len(seen) >= 3 * 6
        assert {hit for _, hit in seen} == {engine.dialect.CACHE_HIT}
        if kind == "postgresql":
            # One text per statement, so psycopg parses each once and the server can prepare it.
            assert len({text for text, _ in seen}) == 3


def test_spool_stays_owner_only_after_a_replay(tmp_path: Path) -> None:
    import os
    import stat

    from admin.spool import UsageSpool

    spool = tmp_path / "spool.jsonl"
    old = os.umask(0o022)
    try:
        UsageSpool(spool).append(_spool_rows({"req-1": 3, "req-2": 4}))
        assert stat.S_IMODE(spool.stat().st_mode) == 0o600
        sink = MeteringSink(_sessions(tmp_path), spool, retry_s=0.02).start()  # replays it
        sink.record(_usage(3, 5))
        sink.close()
    finally:
        os.umask(old)
    assert _rows(_sessions(tmp_path)) == {"req-1": 3, "req-2": 4, "req-3": 5}
    assert stat.S_IMODE(spool.stat().st_mode) == 0o600


def test_persist_returns_once_the_row_is_in_the_spool(tmp_path: Path) -> None:
    import asyncio

    real = _sessions(tmp_path)
    flaky = FlakySessions(real)
    flaky.down.set()  # the database is down: only the spool can hold the row
    spool = tmp_path / "spool.jsonl"
    sink = MeteringSink(flaky, spool, retry_s=0.02).start()  # type: ignore[arg-type]
    asyncio.run(sink.persist(_usage(1, 7)))
    assert '"request_id":"req-1"' in spool.read_text()
    flaky.down.clear()
    sink.close()
    assert _rows(real) == {"req-1": 7}
