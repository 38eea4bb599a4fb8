"""With several gateways on one database, one runner works on a batch at a time: its
lease is renewed while it runs, taken over once it lapses, handed back on a clean stop."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.batch_api.batch_store import BatchStore
from gateway.batch_api.tables import BatchJob
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database


@pytest.fixture
def batches(tmp_path: Path) -> tuple[BatchStore, sessionmaker[Session], str]:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        tenant = store.create_tenant(s, name="acme").id
    batch_store = BatchStore(sessions)
    info = batch_store.create(
        tenant_id=tenant,
        key_id="key_1",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        metadata=None,
        total_lines=3,
        estimated_tokens=10,
        max_queued_tokens=100,
    )
    return batch_store, sessions, info.id


def test_one_runner_holds_a_batch_until_its_lease_lapses(
    batches: tuple[BatchStore, sessionmaker[Session], str],
) -> None:
    batch_store, sessions, batch_id = batches
    assert batch_store.claim(batch_id, "runner-a", lease_s=30)
    assert batch_store.claim(batch_id, "runner-a", lease_s=30)  # renewed
    assert not batch_store.claim(batch_id, "runner-b", lease_s=30)
    with sessions.begin() as s:  # runner-a died: its lease lapses
        row = s.get(BatchJob, batch_id)
        assert row is not None
        row.claimed_until = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    assert batch_store.claim(batch_id, "runner-b", lease_s=30)
    assert not batch_store.claim(batch_id, "runner-a", lease_s=30)


def test_a_clean_stop_hands_the_batch_back_at_once(
    batches: tuple[BatchStore, sessionmaker[Session], str],
) -> None:
    batch_store, _, batch_id = batches
    assert batch_store.claim(batch_id, "runner-a", lease_s=300)
    batch_store.release([batch_id], "runner-b")  # not its lease: nothing changes
    assert not batch_store.claim(batch_id, "runner-b", lease_s=300)
    batch_store.release([batch_id], "runner-a")
    assert batch_store.claim(batch_id, "runner-b", lease_s=300)


def test_an_ended_batch_cannot_be_claimed(
    batches: tuple[BatchStore, sessionmaker[Session], str],
) -> None:
    batch_store, _, batch_id = batches
    batch_store.set_status(batch_id, "completed")
    assert not batch_store.claim(batch_id, "runner-a", lease_s=30)
    assert batch_store.status_of(batch_id) == "completed"
