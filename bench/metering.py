"""Metering benchmark on PostgreSQL: usage-record throughput and the latency `record` adds.

    python bench/metering.py [--database-url URL] [--records 20000]

Throughput: records accepted by MeteringSink until all are committed (batched,
idempotent inserts plus rollups). Added latency: the time `record()` takes on the
request path (it only enqueues). Creates and drops its own database. Last line JSON.
"""

from __future__ import annotations

import argparse
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

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "platform"),
]

from admin.metering import MeteringSink  # noqa: E402
from admin.models import UsageRow  # noqa: E402
from gateway.usage import UsageRecord  # noqa: E402
from tenancy.db import make_engine, make_session_factory, normalize_url, upgrade_database  # noqa: E402


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
        sink = MeteringSink(
            make_session_factory(engine), Path(tempfile.mkdtemp()) / "spool.jsonl"
        ).start()
        added: list[float] = []
        t0 = time.perf_counter()
        for i in range(args.records):
            record = UsageRecord(
                f"req-{i}",
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
            s = time.perf_counter()
            sink.record(record)
            added.append(time.perf_counter() - s)
        sink.close(timeout_s=600)
        elapsed = time.perf_counter() - t0
        with engine.connect() as c:
            stored = c.execute(sa.select(sa.func.count()).select_from(UsageRow)).scalar_one()
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
        }
        print(f"stored {stored}/{args.records} in {elapsed:.2f}s")
        print(json.dumps(summary))
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
