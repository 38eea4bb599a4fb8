"""`AuditLog`: appends hash-chained records to audit_events, checkpoints them, verifies, exports.

Every admin action and every denied access (401/403, gateway and admin) goes
through `record`. Secret-looking detail fields are dropped before hashing, so no
secret ever reaches the log.

Checkpoints are signed every `checkpoint_every` records (at each multiple), every
`checkpoint_interval_s` seconds while `start`ed, and at `close` (shutdown). Each
one is also copied outside the database (`head_path`) for `verify`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import String, select, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_chain import (
    GENESIS,
    OPTIONAL_FIELDS,
    RECORD_FIELDS,
    VerifyReport,
    checkpoint_digest,
    make_checkpoint,
    make_manifest,
    seal,
    verify,
)
from admin.audit_head import load_head, save_head
from admin.models import AuditCheckpoint, AuditEvent

logger = logging.getLogger("cloister.admin.audit")

# "token" alone or as a suffix ("id_token") is a credential; "token_budget",
# "max_output_tokens" and "token_ids" are counts and ids, which before/after must show.
SECRET_NAME = re.compile(
    r"secret|password|authorization|api_key|pepper|signing|bearer|(^|_)token$|^tokens$", re.I
)
CHECKPOINT_FIELDS = ("seq", "record_hash", "prev_digest", "public_key", "signature", "created_at")
CHECKPOINT_LOCK_ID = 0x636C6F6973746572  # PostgreSQL advisory lock: one checkpoint signer


def scrub(detail: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`detail` without any field whose name suggests a secret (recursively)."""
    if detail is None:
        return None
    clean: dict[str, Any] = {}
    for k, v in detail.items():
        if SECRET_NAME.search(k):
            continue
        clean[k] = scrub(v) if isinstance(v, Mapping) else v
    return clean


# The width of each text column of a record (from the model, so a migration that widens
# one widens this).
_WIDTHS: dict[str, int] = {
    c.name: c.type.length
    for c in AuditEvent.__table__.c
    if isinstance(c.type, String) and c.type.length
}


def _fit_columns(fields: dict[str, str | None]) -> dict[str, Any]:
    """Each text field cut to its column's width, before it is hashed.

    Some come from the request (a client address from X-Forwarded-For, a request id);
    PostgreSQL refuses a value longer than its column every time, and such a record
    would never be written.
    """
    return {
        name: value[: _WIDTHS[name]] if value is not None and name in _WIDTHS else value
        for name, value in fields.items()
    }


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat(timespec="microseconds")


def event_dict(row: AuditEvent) -> dict[str, Any]:
    """A stored record as the dict the chain hashes."""
    out = {k: getattr(row, k) for k in (*RECORD_FIELDS, *OPTIONAL_FIELDS)}
    out["hash"] = row.hash
    return out


def checkpoint_dict(row: AuditCheckpoint) -> dict[str, Any]:
    """A stored checkpoint as a dict."""
    return {k: getattr(row, k) for k in CHECKPOINT_FIELDS}


def _lock_checkpoints(session: Session) -> None:
    """Serializes checkpoint signers across processes until this transaction ends.

    Two signers reading the same newest checkpoint would both chain to it (a fork
    `verify` refuses): PostgreSQL takes an advisory lock, SQLite its write lock (a
    write statement that changes nothing still takes it).
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": CHECKPOINT_LOCK_ID})
    elif dialect == "sqlite":
        session.execute(text("DELETE FROM audit_checkpoints WHERE 0"))


class AuditLog:
    """Thread-safe appender; other processes may append too (seq conflicts are retried)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        signing_key: Ed25519PrivateKey | None,
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float | None = None,
        head_path: Path | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._sessions = sessions
        self._key = signing_key
        self._every = checkpoint_every
        self._interval_s = checkpoint_interval_s
        self._head_path = head_path
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def record(
        self,
        *,
        actor: str,
        role: str,
        action: str,
        resource: str,
        outcome: str,
        tenant_id: str | None = None,
        source_ip: str | None = None,
        request_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
        actor_name: str | None = None,
    ) -> dict[str, Any]:
        """Appends one record (and a checkpoint when one is due); returns the sealed record.

        `actor` is the caller's stable id, `actor_name` what a person reads (if any).
        """
        fields = _fit_columns(
            {
                "at": _iso(self._clock()),
                "actor": actor,
                "actor_name": actor_name,
                "role": role,
                "tenant_id": tenant_id,
                "action": action,
                "resource": resource,
                "outcome": outcome,
                "source_ip": source_ip,
                "request_id": request_id,
            }
        )
        fields["detail"] = json.loads(json.dumps(scrub(detail), default=str)) if detail else None
        with self._lock:
            for _attempt in range(20):
                with self._sessions() as session:
                    last = session.scalars(
                        select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)
                    ).first()
                    seq = (last.seq if last else 0) + 1
                    sealed = seal(fields, seq=seq, prev_hash=last.hash if last else GENESIS)
                    session.add(AuditEvent(**sealed))
                    try:
                        session.commit()
                    except IntegrityError:  # another process took this seq
                        session.rollback()
                        continue
                if self._key is not None and seq % self._every == 0:
                    self.checkpoint(at_seq=seq)
                return sealed
        raise RuntimeError("audit log append kept conflicting")

    def checkpoint(self, at_seq: int | None = None) -> dict[str, Any] | None:
        """Signs record `at_seq` (default: the head); no-op without a key or if already covered.

        Any multiple of `checkpoint_every` between the newest checkpoint and `at_seq` is
        signed first, so the periodic checkpoints exist whoever signs. Returns the
        newest checkpoint made.
        """
        if self._key is None:
            return None
        with self._sessions() as session:
            _lock_checkpoints(session)
            query = select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)
            if at_seq is not None:
                query = select(AuditEvent).where(AuditEvent.seq == at_seq)
            head = session.scalars(query).first()
            prev = session.scalars(
                select(AuditCheckpoint).order_by(AuditCheckpoint.seq.desc()).limit(1)
            ).first()
            if head is None or (prev is not None and prev.seq >= head.seq):
                session.rollback()
                return None
            start = prev.seq if prev is not None else 0
            due = [s for s in range(start + 1, head.seq) if s % self._every == 0]
            rows = session.execute(
                select(AuditEvent.seq, AuditEvent.hash).where(AuditEvent.seq.in_(due))
            )
            hashes: dict[int, str] = {seq: h for seq, h in rows}
            hashes[head.seq] = head.hash
            digest = checkpoint_digest(checkpoint_dict(prev)) if prev else GENESIS
            made_at = _iso(self._clock())
            cp: dict[str, Any] = {}
            for seq in [*due, head.seq]:
                cp = make_checkpoint(
                    self._key,
                    seq=seq,
                    record_hash=hashes[seq],
                    prev_digest=digest,
                    created_at=made_at,
                )
                session.add(AuditCheckpoint(**cp))
                digest = checkpoint_digest(cp)
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                return None
        if self._head_path is not None:
            try:
                save_head(self._head_path, cp)
            except OSError:
                logger.warning("could not save the audit head copy to %s", self._head_path)
        return cp

    def start(self) -> AuditLog:
        """Signs the head now and then every `checkpoint_interval_s` seconds, on a thread."""
        if self._key is None or self._interval_s is None or self._ticker is not None:
            return self
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="audit-checkpoints", daemon=True)
        self._ticker.start()
        return self

    def close(self) -> None:
        """Stops the timer and signs the head (the shutdown checkpoint)."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            self._stop.set()
            ticker.join(timeout=30)
        self._checkpoint_logged()

    def _tick(self) -> None:
        interval = self._interval_s or 0.0
        self._checkpoint_logged()
        while not self._stop.wait(interval):
            self._checkpoint_logged()

    def _checkpoint_logged(self) -> None:
        # A database that is down must not stop the server: the next tick retries.
        try:
            self.checkpoint()
        except SQLAlchemyError as exc:
            logger.warning("audit checkpoint failed, retrying later: %s", type(exc).__name__)

    def load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every record and checkpoint, in seq order."""
        with self._sessions() as session:
            records = [
                event_dict(r) for r in session.scalars(select(AuditEvent).order_by(AuditEvent.seq))
            ]
            cps = [
                checkpoint_dict(c)
                for c in session.scalars(select(AuditCheckpoint).order_by(AuditCheckpoint.seq))
            ]
        return records, cps

    def verify(self, *, public_key: str) -> VerifyReport:
        """Verifies the stored chain and checkpoints (periodic ones are expected), and
        that they still reach the checkpoint copy kept outside the database."""
        records, cps = self.load()
        head = None
        if self._head_path is not None:
            try:
                head = load_head(self._head_path)
            except ValueError as exc:
                return VerifyReport(False, len(records), len(cps), 1, str(exc))
        return verify(records, cps, public_key=public_key, interval=self._every, head=head)

    def export_jsonl(self) -> str:
        """A signed manifest line, then records and checkpoints in seq order (JSON lines)."""
        if self._key is None:
            raise RuntimeError("export needs the audit signing key")
        records, cps = self.load()
        manifest = make_manifest(self._key, records, cps)
        lines = [json.dumps({"type": "manifest", **manifest}, sort_keys=True)]
        by_seq = {c["seq"]: c for c in cps}
        for r in records:
            lines.append(json.dumps({"type": "record", **r}, sort_keys=True, separators=(",", ":")))
            if r["seq"] in by_seq:
                lines.append(json.dumps({"type": "checkpoint", **by_seq[r["seq"]]}, sort_keys=True))
        return "\n".join(lines) + "\n"
