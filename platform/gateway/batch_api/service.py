"""The Batch API's objects, built once per app: stores, caps and the runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.batch_api.batch_store import BatchStore
from gateway.batch_api.blob_factory import blob_store_from_settings
from gateway.batch_api.file_store import FileLimits, FileStore
from gateway.batch_api.runner import BatchRunner, PrincipalOfKey
from server.settings import Settings


@dataclass(frozen=True)
class BatchApi:
    """What the files and batches routes use; `runner` runs in the app's lifespan."""

    files: FileStore
    batches: BatchStore
    runner: BatchRunner
    max_queued_tokens: int

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        sessions: sessionmaker[Session],
        principal_of_key: PrincipalOfKey,
        *,
        files_root: Path | None = None,
    ) -> BatchApi:
        """The Batch API over `sessions`, with file bodies in the configured store (an S3
        bucket, else <data_dir>/files); FileStoreConfigError if it is unusable."""
        root = files_root or settings.data_dir / "files"
        files = FileStore(
            sessions,
            root,
            FileLimits(
                max_file_bytes=settings.gateway.batch_max_file_bytes,
                max_file_lines=settings.gateway.batch_max_file_lines,
                max_files_per_tenant=settings.gateway.batch_max_files_per_tenant,
                max_bytes_per_tenant=settings.gateway.batch_max_bytes_per_tenant,
            ),
            blob_store_from_settings(settings, root),
        )
        batches = BatchStore(sessions)
        runner = BatchRunner(
            batches,
            files,
            principal_of_key,
            concurrency=settings.gateway.batch_concurrency,
            lease_s=settings.gateway.batch_lease_s,
        )
        return cls(
            files=files,
            batches=batches,
            runner=runner,
            max_queued_tokens=settings.gateway.batch_max_queued_tokens,
        )
