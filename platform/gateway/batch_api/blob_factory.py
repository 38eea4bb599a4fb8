"""The file-body store the settings name, checked before the server serves."""

from __future__ import annotations

from pathlib import Path

from gateway.batch_api.blob_store import BlobStore, LocalBlobStore
from server.settings import Settings


def blob_store_from_settings(settings: Settings, root: Path) -> BlobStore:
    """The S3 bucket of CLOISTER_FILES_S3_BUCKET, else the folder `root`; checked once
    (FileStoreConfigError: one line naming the bucket and endpoint, no secret)."""
    store: BlobStore
    if not settings.gateway.files_s3_bucket:
        store = LocalBlobStore(root)
    else:
        # Imported only here: a server without a bucket never loads boto3.
        from gateway.batch_api.s3_blob_store import S3BlobStore, s3_client

        secret = settings.gateway.files_s3_secret_access_key
        client = s3_client(
            endpoint_url=settings.gateway.files_s3_endpoint_url,
            region=settings.gateway.files_s3_region,
            access_key_id=settings.gateway.files_s3_access_key_id or None,
            secret_access_key=secret.get_secret_value() if secret is not None else None,
            timeout_s=settings.gateway.files_s3_timeout_s,
        )
        store = S3BlobStore(
            client,
            bucket=settings.gateway.files_s3_bucket,
            prefix=settings.gateway.files_s3_prefix,
            endpoint_url=settings.gateway.files_s3_endpoint_url,
        )
    store.check()
    return store


def files_location(settings: Settings) -> str:
    """Where file bodies live, for the start-up summary (no credentials)."""
    if not settings.gateway.files_s3_bucket:
        return f"data directory {(settings.data_dir / 'files').resolve()}"
    prefix = f"{settings.gateway.files_s3_prefix}/" if settings.gateway.files_s3_prefix else ""
    return (
        f"S3 bucket {settings.gateway.files_s3_bucket} at "
        f"{settings.gateway.files_s3_endpoint_url or 'AWS S3'}, keys {prefix}<tenant>/<file id>"
    )


def check_file_store(settings: Settings) -> None:
    """Refuses an unusable file store before the server loads its models (a model can
    take minutes; a wrong bucket name should not): FileStoreConfigError."""
    blob_store_from_settings(settings, settings.data_dir / "files")
