"""The audit hash chain and its Ed25519 checkpoints, as pure functions (no database).

    record n:     hash_n = sha256(canonical({fields..., seq: n, prev_hash: hash_{n-1}}))
    checkpoint:   sig = Ed25519(canonical({seq, record_hash, prev_digest}))
                  digest = sha256(canonical({seq, record_hash, prev_digest, signature}))
    manifest:     Ed25519 over {count, head_hash, checkpoints, last_checkpoint_digest}

Checkpoints chain through `prev_digest`, so removing one breaks the next; the
export's signed manifest fixes the record count, so truncating the tail shows.
Checkpoints are signed every N records, every T seconds and at shutdown, so that
no more than T seconds of records are ever unsigned; a copy of the newest one kept
outside the database (audit_head.py) shows when the newest checkpoints were
deleted with the tail they cover. `verify` names the first record that can no
longer be trusted, and reports the newest checkpoint (what after it is unsigned).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

GENESIS = "0" * 64
RECORD_FIELDS = (
    "seq",
    "at",
    "actor",
    "role",
    "tenant_id",
    "action",
    "resource",
    "outcome",
    "source_ip",
    "request_id",
    "detail",
    "prev_hash",
)
# Hashed only when set, so records written before a field existed keep their hash.
OPTIONAL_FIELDS = ("actor_name",)


def canonical(data: Mapping[str, Any]) -> bytes:
    """Canonical JSON: sorted keys, no spaces, UTF-8."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(record: Mapping[str, Any]) -> str:
    """The hash a record must carry (over RECORD_FIELDS, and OPTIONAL_FIELDS when set)."""
    hashed = {k: record.get(k) for k in RECORD_FIELDS}
    hashed.update({k: record[k] for k in OPTIONAL_FIELDS if record.get(k) is not None})
    return hashlib.sha256(canonical(hashed)).hexdigest()


def seal(fields: Mapping[str, Any], *, seq: int, prev_hash: str) -> dict[str, Any]:
    """A complete record: the fields plus seq, prev_hash and its own hash."""
    record = {k: fields.get(k) for k in (*RECORD_FIELDS, *OPTIONAL_FIELDS)}
    record["seq"] = seq
    record["prev_hash"] = prev_hash
    record["hash"] = record_hash(record)
    return record


def load_private_key(hex_seed: str) -> Ed25519PrivateKey:
    """An Ed25519 key from its 32-byte seed in hex."""
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(hex_seed))


def public_hex(key: Ed25519PrivateKey) -> str:
    """The raw public key of `key`, hex."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _checkpoint_body(cp: Mapping[str, Any]) -> dict[str, Any]:
    return {"seq": cp["seq"], "record_hash": cp["record_hash"], "prev_digest": cp["prev_digest"]}


def checkpoint_digest(cp: Mapping[str, Any]) -> str:
    """The digest the next checkpoint chains to."""
    return hashlib.sha256(
        canonical({**_checkpoint_body(cp), "signature": cp["signature"]})
    ).hexdigest()


def make_checkpoint(
    key: Ed25519PrivateKey, *, seq: int, record_hash: str, prev_digest: str, created_at: str
) -> dict[str, Any]:
    """A signed checkpoint over record `seq`."""
    body = {"seq": seq, "record_hash": record_hash, "prev_digest": prev_digest}
    return {
        **body,
        "public_key": public_hex(key),
        "signature": key.sign(canonical(body)).hex(),
        "created_at": created_at,
    }


def _manifest_body(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: m[k] for k in ("count", "head_hash", "checkpoints", "last_checkpoint_digest")}


def make_manifest(
    key: Ed25519PrivateKey,
    records: Sequence[Mapping[str, Any]],
    checkpoints: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The signed summary an export starts with."""
    body = {
        "count": len(records),
        "head_hash": records[-1]["hash"] if records else GENESIS,
        "checkpoints": len(checkpoints),
        "last_checkpoint_digest": checkpoint_digest(checkpoints[-1]) if checkpoints else GENESIS,
    }
    return {**body, "public_key": public_hex(key), "signature": key.sign(canonical(body)).hex()}


def _signed_by(public_key: str, signature: str, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(
            bytes.fromhex(signature), message
        )
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a verification: ok, or the first bad record's seq and why."""

    ok: bool
    records: int
    checkpoints: int
    first_bad_seq: int | None = None
    reason: str | None = None
    newest_checkpoint_seq: int | None = None  # the last record a verified signature covers
    newest_checkpoint_at: str | None = None  # when that checkpoint was signed (ISO 8601)

    @property
    def unsigned(self) -> int:
        """How many records come after the newest signed checkpoint (not yet protected)."""
        return self.records - (self.newest_checkpoint_seq or 0)


def _check_records(
    records: Sequence[Mapping[str, Any]],
) -> tuple[dict[int, str], VerifyReport | None]:
    hashes: dict[int, str] = {}
    prev, expected = GENESIS, 1
    for rec in records:
        seq = rec.get("seq")
        if seq != expected:
            why = f"expected record {expected}, found {seq!r} (missing, reordered or altered)"
            return hashes, VerifyReport(False, len(records), 0, expected, why)
        if rec.get("prev_hash") != prev:
            return hashes, VerifyReport(
                False, len(records), 0, expected, "prev_hash breaks the chain"
            )
        if record_hash(rec) != rec.get("hash"):
            return hashes, VerifyReport(False, len(records), 0, expected, "record content altered")
        prev = str(rec["hash"])
        hashes[expected] = prev
        expected += 1
    return hashes, None


def verify(
    records: Sequence[Mapping[str, Any]],
    checkpoints: Sequence[Mapping[str, Any]],
    *,
    public_key: str,
    interval: int | None = None,
    manifest: Mapping[str, Any] | None = None,
    head: Mapping[str, Any] | None = None,
) -> VerifyReport:
    """Checks the chain, the checkpoints (signed by `public_key`) and the manifest if given.

    `interval`: checkpoints are expected at every multiple of it (a removed one shows
    even when it was the last). `head`: a signed checkpoint kept outside the database
    (the newest this host signed); the records must still match it, and the stored
    checkpoints reach at least as far. Records must be in seq order starting at 1.
    """
    n_rec, n_cp = len(records), len(checkpoints)
    hashes, bad = _check_records(records)
    if bad is not None:
        return VerifyReport(False, n_rec, n_cp, bad.first_bad_seq, bad.reason)
    last = n_rec

    def fail(seq: int, reason: str) -> VerifyReport:
        return VerifyReport(False, n_rec, n_cp, seq, reason)

    digest, covered, covered_at = GENESIS, 0, None
    seen: set[int] = set()
    for cp in checkpoints:
        body = _checkpoint_body(cp)
        if cp.get("public_key") != public_key or not _signed_by(
            public_key, str(cp.get("signature")), canonical(body)
        ):
            return fail(covered + 1, f"checkpoint at record {cp.get('seq')} has a bad signature")
        if cp["prev_digest"] != digest:
            return fail(covered + 1, f"checkpoint before record {cp['seq']} was removed")
        if cp["seq"] > last:
            return fail(last + 1, f"records after {last} are missing (log truncated)")
        if hashes.get(cp["seq"]) != cp["record_hash"]:
            return fail(covered + 1, f"records up to {cp['seq']} differ from the signed checkpoint")
        digest, covered, covered_at = checkpoint_digest(cp), cp["seq"], cp.get("created_at")
        seen.add(cp["seq"])
    if interval:
        for due in range(interval, last + 1, interval):
            if due not in seen:
                return fail(due - interval + 1, f"checkpoint at record {due} is missing")
    if manifest is not None:
        if manifest.get("public_key") != public_key or not _signed_by(
            public_key, str(manifest.get("signature")), canonical(_manifest_body(manifest))
        ):
            return fail(1, "export manifest has a bad signature")
        if manifest["count"] > last:
            return fail(last + 1, f"records after {last} are missing (log truncated)")
        if manifest["count"] < last or manifest["head_hash"] != (hashes.get(last) or GENESIS):
            return fail(manifest["count"] + 1, "records beyond the signed head")
        if manifest["checkpoints"] != n_cp or manifest["last_checkpoint_digest"] != digest:
            return fail(covered + 1, "a checkpoint was removed")
    if head is not None:
        bad_head = _check_head(head, hashes, last, covered, public_key)
        if bad_head is not None:
            return fail(*bad_head)
    return VerifyReport(
        True, n_rec, n_cp, newest_checkpoint_seq=covered or None, newest_checkpoint_at=covered_at
    )


def _check_head(
    head: Mapping[str, Any], hashes: Mapping[int, str], last: int, covered: int, public_key: str
) -> tuple[int, str] | None:
    """(first bad seq, why) when the records or checkpoints fall short of `head`."""
    seq, made = head.get("seq"), head.get("created_at")
    if not isinstance(seq, int) or not _signed_by(
        public_key, str(head.get("signature")), canonical(_checkpoint_body(head))
    ):
        return 1, "the checkpoint copy outside the database has a bad signature"
    if seq > last:
        return last + 1, (
            f"records after {last} are missing (log truncated): a checkpoint signed at "
            f"{made} covers record {seq}"
        )
    if hashes.get(seq) != head.get("record_hash"):
        return 1, f"records up to {seq} differ from the checkpoint signed at {made}"
    if seq > covered:
        return covered + 1, (
            f"the checkpoint at record {seq} (signed at {made}) was removed from the database"
        )
    return None


def parse_export(
    text: str,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """An export's (manifest, records, checkpoints); an unparsable line becomes a bad record."""
    manifest: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            kind = item.pop("type")
        except (json.JSONDecodeError, KeyError, AttributeError):
            records.append({"seq": None, "corrupt": line})
            continue
        if kind == "manifest":
            manifest = item
        elif kind == "checkpoint":
            checkpoints.append(item)
        else:
            records.append(item)
    return manifest, records, checkpoints
