"""What `cloister serve` loaded, recorded in the registry at start-up.

The registry is the source of truth for what is served: each model a server loads is
registered (or brought up to date) with status `loaded` and the device and dtype it
runs on, and models left `loaded` by an earlier run that this one does not serve go
back to `registered` with their device and dtype cleared. A model registered here has
no price (its usage is marked unpriced until one is set). Each change is audited with
the actor `system:serve`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.audit_writer import AuditWriter
from admin.models import RegisteredModel
from tenancy.errors import ConflictError

ACTOR = "system:serve"
# How much of each end of a weights file the fingerprint reads: a full digest of a
# multi-gigabyte file would cost seconds at every start.
FINGERPRINT_EDGE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServedModel:
    """The model one server process loaded, as the registry describes it."""

    name: str
    source: str
    format: str  # one of registry.MODEL_FORMATS
    context_length: int
    revision: str  # a fingerprint of the weights (see `fingerprint`)
    device: str | None = None  # "cpu", "cuda", ...: as the engine was built
    dtype: str | None = None  # "float32", "bfloat16", ...
    family: str | None = None  # "qwen3", "llama", ... (engine.model.registry)
    quantization: str | None = None  # "Q4_K+Q6_K", "BF16", ...


def fingerprint(source: Path) -> str:
    """`sha256-edges:<hex>` of the weights' size and first and last MiB, per file.

    Cheap enough for every start and changes whenever a file is replaced or resized;
    not a full content digest, which the name says.
    """
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            digest.update(f.read(FINGERPRINT_EDGE_BYTES))
            if size > 2 * FINGERPRINT_EDGE_BYTES:
                f.seek(size - FINGERPRINT_EDGE_BYTES)
                digest.update(f.read(FINGERPRINT_EDGE_BYTES))
    return f"sha256-edges:{digest.hexdigest()[:32]}"


def describe(
    name: str,
    source: Path,
    context_length: int,
    *,
    device: str | None = None,
    dtype: str | None = None,
    family: str | None = None,
    quantization: str | None = None,
) -> ServedModel:
    """The registry's description of a model file (GGUF) or Hugging Face folder."""
    fmt = "safetensors" if source.is_dir() else "gguf"
    return ServedModel(
        name=name,
        source=str(source.resolve()),
        format=fmt,
        context_length=context_length,
        revision=fingerprint(source),
        device=device,
        dtype=dtype,
        family=family,
        quantization=quantization,
    )


def record_served(
    sessions: sessionmaker[Session], audit: AuditWriter, *served: ServedModel
) -> list[RegisteredModel]:
    """Registers each of `served` as loaded (new or updated); un-loads the models left
    loaded that none of them is (an earlier run's)."""
    with sessions() as session:
        rows = [_record_loaded_once(session, audit, one) for one in served]
        names = {one.name for one in served}
        for stale in registry.list_models(session, status="loaded"):
            if stale.name not in names:
                stale.status = "registered"
                stale.device = stale.dtype = None
                session.commit()
                _audit(audit, "model.unload", stale.name)
        for row in rows:
            session.refresh(row)
            session.expunge(row)
        return rows


def _record_loaded_once(
    session: Session, audit: AuditWriter, served: ServedModel
) -> RegisteredModel:
    """`_record_loaded`, once more if another gateway starting at the same moment
    registered the same new model between our read and our insert."""
    try:
        return _record_loaded(session, audit, served)
    except (IntegrityError, ConflictError):
        session.rollback()
        return _record_loaded(session, audit, served)


def _record_loaded(session: Session, audit: AuditWriter, served: ServedModel) -> RegisteredModel:
    """`served`'s registry row, registered if new, brought up to date and `loaded`."""
    row = session.scalars(
        select(RegisteredModel).where(RegisteredModel.name == served.name)
    ).first()
    if row is None:
        row = registry.register_model(
            session,
            name=served.name,
            source=served.source,
            format=served.format,
            context_length=served.context_length,
            revision=served.revision,
        )
        _audit(audit, "model.register", served.name, revision=served.revision)
    changed = {
        field: getattr(served, field)
        for field in (
            "source",
            "format",
            "context_length",
            "revision",
            "device",
            "dtype",
            "family",
            "quantization",
        )
        if getattr(row, field) != getattr(served, field)
    }
    for field, value in changed.items():
        setattr(row, field, value)
    if row.status != "loaded" or changed:
        row.status = "loaded"
        session.commit()
        _audit(audit, "model.load", served.name, **changed)
    return row


def _audit(audit: AuditWriter, action: str, name: str, **detail: object) -> None:
    audit.record(
        actor=ACTOR,
        role="system",
        action=action,
        resource=f"models/{name}",
        outcome="success",
        detail=detail or None,
    )
