"""Offline verification of an audit export file: no database, no server, no settings.

An export (AuditLog.export_jsonl) is a signed manifest line, then the records in
seq order, each followed by its checkpoint when one was signed there. `verify_export`
reads it keeping each item's line number, runs the chain, checkpoint and manifest
checks of admin/audit_chain.py (the same hashing the server uses, over whatever
fields a record has), and names the first line of the file at fault.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from admin.audit_chain import VerifyReport, verify

_CHECKPOINT_SEQ = re.compile(r"checkpoint (?:at|before) record (\d+)|records up to (\d+) differ")


@dataclass(frozen=True)
class FileVerdict:
    """The outcome for one file: ok, or the line at fault; `message` is one line."""

    ok: bool
    message: str
    line: int | None = None  # 1-based line of the file at fault
    report: VerifyReport | None = None
    public_key: str | None = None
    key_from_file: bool = False  # no trusted key was given: the manifest's own was used


@dataclass(frozen=True)
class _Item:
    line: int
    data: dict[str, Any]


@dataclass(frozen=True)
class _Parsed:
    manifest: _Item | None
    records: list[_Item]
    checkpoints: list[_Item]
    last_line: int


class _BadLine(Exception):
    def __init__(self, line: int, why: str) -> None:
        super().__init__(why)
        self.line = line


def _parse(text: str) -> _Parsed:
    manifest: _Item | None = None
    records: list[_Item] = []
    checkpoints: list[_Item] = []
    last = 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        last = n
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _BadLine(n, f"not JSON ({exc.msg})") from exc
        kind = item.pop("type", None) if isinstance(item, dict) else None
        if kind == "manifest":
            if manifest is not None or records or checkpoints:
                raise _BadLine(n, "a manifest must be the first line, and only one")
            manifest = _Item(n, item)
        elif kind == "record":
            records.append(_Item(n, item))
        elif kind == "checkpoint":
            checkpoints.append(_Item(n, item))
        else:
            raise _BadLine(n, "not an audit export line (no type manifest, record or checkpoint)")
    return _Parsed(manifest, records, checkpoints, last)


def _line_at_fault(report: VerifyReport, parsed: _Parsed) -> int:
    """The file line the report's first failure is about."""
    reason = report.reason or ""
    found = _CHECKPOINT_SEQ.search(reason)
    if found:
        seq = int(found.group(1) or found.group(2))
        for cp in parsed.checkpoints:
            if cp.data.get("seq") == seq:
                return cp.line
    if "manifest" in reason and parsed.manifest is not None:
        return parsed.manifest.line
    # The chain checks stop at the first record out of place: the (seq-1)-th in the file.
    index = (report.first_bad_seq or 1) - 1
    if 0 <= index < len(parsed.records):
        return parsed.records[index].line
    return parsed.last_line


def _what(parsed: _Parsed, line: int) -> str:
    """What the file holds at `line`, for the message: " (record 7)" and the like."""
    if parsed.manifest is not None and parsed.manifest.line == line:
        return " (the manifest)"
    for r in parsed.records:
        if r.line == line:
            return f" (record {r.data.get('seq')})"
    for c in parsed.checkpoints:
        if c.line == line:
            return f" (the checkpoint of record {c.data.get('seq')})"
    return ""


def verify_export(
    text: str, *, public_key: str | None = None, interval: int | None = None
) -> FileVerdict:
    """Verifies an export's chain, checkpoints and signed manifest.

    `public_key` (hex Ed25519) is the key the operator publishes; without it the
    manifest's own key is used, which proves the file is intact but not who signed it.
    `interval`: the exporter's checkpoint interval, if known (each multiple must have one).
    """
    try:
        parsed = _parse(text)
    except _BadLine as exc:
        return FileVerdict(False, f"FAILED at line {exc.line}: {exc}", line=exc.line)
    if parsed.manifest is None:
        return FileVerdict(False, "FAILED at line 1: no signed manifest line", line=1)
    key = public_key or str(parsed.manifest.data.get("public_key") or "")
    report = verify(
        [r.data for r in parsed.records],
        [c.data for c in parsed.checkpoints],
        public_key=key,
        interval=interval,
        manifest=parsed.manifest.data,
    )
    from_file = public_key is None
    if not report.ok:
        line = _line_at_fault(report, parsed)
        return FileVerdict(
            False,
            f"FAILED at line {line}{_what(parsed, line)}: {report.reason}",
            line=line,
            report=report,
            public_key=key,
            key_from_file=from_file,
        )
    signer = (
        f"signed by the key in its manifest, {key} (compare it with the operator's published key)"
        if from_file
        else f"signed by {key}"
    )
    return FileVerdict(
        True,
        f"ok: {report.records} records, {report.checkpoints} checkpoints, "
        f"chain and signatures intact; {signer}",
        report=report,
        public_key=key,
        key_from_file=from_file,
    )
