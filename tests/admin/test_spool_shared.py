"""Two writers on one spool file (two gateways started on one data folder).

Each side appends its own rows while replaying (read, then clear what it read), as
MeteringSink does; every row must end up either replayed by one side or still in the
file. Before the spool locked across instances and cleared by line, a clear on one side
dropped rows the other had appended after its read.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from admin.spool import UsageSpool

ROWS_PER_SIDE = 300


def _side(spool: UsageSpool, name: str, replayed: list[dict[str, Any]]) -> None:
    for i in range(ROWS_PER_SIDE):
        spool.append([{"request_id": f"{name}-{i}", "tokens": i}])
        if i % 7 == 0:
            rows, lines = spool.read()
            replayed.extend(rows)
            spool.clear(lines)


def test_two_spools_on_one_file_lose_no_row(tmp_path: Path) -> None:
    path = tmp_path / "usage-spool.jsonl"
    a, b = UsageSpool(path, fsync=False), UsageSpool(path, fsync=False)
    replayed_a: list[dict[str, Any]] = []
    replayed_b: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=_side, args=(a, "a", replayed_a)),
        threading.Thread(target=_side, args=(b, "b", replayed_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left, _ = a.read()
    seen = [r["request_id"] for r in replayed_a + replayed_b + left]
    expected = {f"{side}-{i}" for side in "ab" for i in range(ROWS_PER_SIDE)}
    # A row may be replayed by both sides (both read it before either cleared: the
    # database side is idempotent by request id), but never by neither.
    assert set(seen) == expected


def test_clear_keeps_lines_appended_after_the_read(tmp_path: Path) -> None:
    path = tmp_path / "usage-spool.jsonl"
    spool, other = UsageSpool(path, fsync=False), UsageSpool(path, fsync=False)
    spool.append([{"request_id": "r1"}, {"request_id": "r2"}])
    rows, lines = spool.read()
    other.clear(other.read()[1])  # the other process replayed both meanwhile
    other.append([{"request_id": "r3"}])
    spool.clear(lines)
    assert [r["request_id"] for r in rows] == ["r1", "r2"]
    assert [r["request_id"] for r in spool.read()[0]] == ["r3"]
