"""Metering benchmark on PostgreSQL: usage-record throughput and the latency `record` adds.

    python bench/metering.py [--database-url URL] [--records 20000]

Throughput: records accepted by MeteringSink until all are committed (batched,
idempotent inserts plus rollups). Added latency: the time `record()` takes on the
request path (it only enqueues). CPU: this process's CPU time per record during
that run, and write_usage's CPU per batch of 1, 10 and 50 rows (the metering
thread holds the GIL for it, which the gateway's event loop and engine need).
Creates and drops its own database. Last line JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "platform"),
]

from admin.metering import MeteringSink, usage_row  # noqa: E402
from admin.models import UsageRow  # noqa: E402
from admin.usage_store import write_usage  # noqa: E402
from gateway.usage import UsageRecord  # noqa: E402
from tenancy.db import make_engine, make_session_factory, normalize_url, upgrade_database  # noqa: E402


def sample_record(i: int, prefix: str = "req") -> UsageRecord:
    """Usage record number `i` of a run (request id `{prefix}-{i}`): 50 tenants and 500
    keys in turn, one model, typical token counts and timings."""
    return UsageRecord(
        f"{prefix}-{i}",
        f"ten_{i % 50}",
        f"key_{i % 500}",
        "m",
        120,
        40,
        64,
        0.05,
        0.9,
        200,
        "stop",
        False,
    )


def write_cpu_ms(
    sessions: sessionmaker[Session], first_id: int, batches: int = 100
) -> dict[str, float]:
    """write_usage's CPU per batch (ms) for batches of 1, 10 and 50 new rows, after a warm-up."""
    now = dt.datetime.now(dt.UTC)
    next_id = first_id
    out: dict[str, float] = {}
    for size in (1, 10, 50):
        work = []
        for _ in range(batches + 5):
            work.append([usage_row(sample_record(next_id + i), now) for i in range(size)])
            next_id += size
        for rows in work[:5]:
            with sessions() as s:
                write_usage(s, rows)
        start = time.process_time()
        for rows in work[5:]:
            with sessions() as s:
                write_usage(s, rows)
        out[str(size)] = round((time.process_time() - start) / batches * 1e3, 3)
    return out


def main() -> None:
    """Runs the benchmark and prints a JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    server = normalize_url(args.database_url)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"cloister_bench_{secrets.token_hex(4)}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_database(url)
        engine = make_engine(url)
        sessions = make_session_factory(engine)
        sink = MeteringSink(sessions, Path(tempfile.mkdtemp()) / "spool.jsonl").start()
        added: list[float] = []
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for i in range(args.records):
            record = sample_record(i)
            s = time.perf_counter()
            sink.record(record)
            added.append(time.perf_counter() - s)
        sink.close(timeout_s=600)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        with engine.connect() as c:
            stored = c.execute(sa.select(sa.func.count()).select_from(UsageRow)).scalar_one()
        per_batch = write_cpu_ms(sessions, first_id=args.records)
        engine.dispose()
        added.sort()
        summary = {
            "records": args.records,
            "stored": int(stored),
            "seconds": round(elapsed, 3),
            "records_per_s": round(args.records / elapsed, 1),
            "added_latency_p50_us": round(statistics.median(added) * 1e6, 2),
            "added_latency_p99_us": round(added[int(0.99 * (len(added) - 1))] * 1e6, 2),
            "spooled_batches": sink.db_failures,
            "cpu_us_per_record": round(cpu / args.records * 1e6, 1),
            "write_usage_cpu_ms_per_batch": per_batch,
        }
        print(f"stored {stored}/{args.records} in {elapsed:.2f}s")
        print(json.dumps(summary))
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
