"""File bodies in an S3-compatible bucket (AWS S3, MinIO, Ceph, R2...) through boto3.

Objects are "<prefix>/<tenant id>/<file id>". Uploads go through boto3's transfer
manager (multipart above its threshold, from the staged file: never held in memory);
reads stream the object's body. Every call blocks: async callers use a worker thread.
A store that cannot be reached (refused connection, timeout, 5xx, denied) is a
`FileStoreUnavailableError`; its messages never carry the credentials.
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from gateway.batch_api.blob_store import (
    BlobMissingError,
    FileStoreConfigError,
    unavailable,
)

logger = logging.getLogger("cloister.files")

READ_BUFFER_BYTES = 1024 * 1024
SPOOL_BYTES = 8 * 1024 * 1024  # a generated file larger than this is spooled to disk
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _storage_errors() -> tuple[type[BaseException], ...]:
    """What boto3 raises when the store fails (imported lazily with boto3)."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    # urllib3's errors can escape a streaming read; OSError covers a reset socket.
    from urllib3.exceptions import HTTPError

    return (Boto3Error, BotoCoreError, ClientError, HTTPError, OSError)


class _BodyReader(io.RawIOBase):
    """An object's streaming body as a raw stream whose failures are 503s.

    The runner reads a batch's input a chunk of lines at a time, for as long as the
    batch runs; a store may drop a connection idle that long. A read that breaks off is
    resumed from the same offset with a ranged GET; a resume that fails too is the
    store's failure.
    """

    def __init__(
        self,
        body: Any,
        reopen: Callable[[int], Any],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._body = body
        self._reopen = reopen
        self._errors = errors
        self._offset = 0

    def readable(self) -> bool:
        """Always."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Fills `buffer` from the body (0 at its end)."""
        view = memoryview(buffer).cast("B")
        try:
            data = self._body.read(len(view))
        except self._errors:
            logger.info("an object read broke off; resuming it", exc_info=True)
            try:
                self._body.close()
                self._body = self._reopen(self._offset)
                data = self._body.read(len(view))
            except self._errors:
                logger.warning("reading a file from the object store failed", exc_info=True)
                raise unavailable("reading a file") from None
        view[: len(data)] = data
        self._offset += len(data)
        return len(data)

    def close(self) -> None:
        """Closes the connection under the body."""
        if not self.closed:
            self._body.close()
        super().close()


class S3BlobStore:
    """Bodies as objects of one bucket; see the module docstring."""

    def __init__(self, client: Any, *, bucket: str, prefix: str, endpoint_url: str | None) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._endpoint = endpoint_url or "AWS S3"
        self._errors = _storage_errors()
        from boto3.s3.transfer import TransferConfig

        # A few parts in flight per upload: quick for 200 MiB without a thread swarm.
        self._transfer = TransferConfig(max_concurrency=4)

    def object_key(self, key: str) -> str:
        """The object key of a store key."""
        return f"{self._prefix}/{key}" if self._prefix else key

    def check(self) -> None:
        """HEAD on the bucket: FileStoreConfigError naming bucket and endpoint if it fails."""
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except self._errors as exc:
            code = _error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                reason = "it does not exist"
            elif code in ("403", "AccessDenied", "Forbidden"):
                reason = "access is denied (check the credentials and the bucket policy)"
            elif code:
                reason = f"the store answered {code}"
            elif type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
                reason = (
                    "no credentials (set CLOISTER_FILES_S3_ACCESS_KEY_ID and "
                    "CLOISTER_FILES_S3_SECRET_ACCESS_KEY, or AWS_ACCESS_KEY_ID and its secret)"
                )
            else:
                reason = f"it cannot be reached ({type(exc).__name__})"
            raise FileStoreConfigError(
                f"cannot use the files bucket {self._bucket!r} at {self._endpoint}: {reason}"
            ) from None

    def put_staged(self, key: str, staged: Path) -> None:
        """Uploads the staged file (multipart when large); `staged` stays for the caller."""
        try:
            self._client.upload_file(
                str(staged), self._bucket, self.object_key(key), Config=self._transfer
            )
        except self._errors:
            logger.warning("storing a file in the object store failed", exc_info=True)
            raise unavailable("storing the file") from None

    def put_chunks(self, key: str, chunks: Iterable[bytes]) -> None:
        """Spools the chunks (to disk past SPOOL_BYTES), then uploads them as one object:
        an object appears whole or not at all."""
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.seek(0)
            try:
                self._client.upload_fileobj(
                    spool, self._bucket, self.object_key(key), Config=self._transfer
                )
            except self._errors:
                logger.warning("writing a file to the object store failed", exc_info=True)
                raise unavailable("writing a file") from None

    def open(self, key: str) -> BinaryIO:
        """A buffered stream over the object's body (read as it is consumed)."""
        object_key = self.object_key(key)
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=object_key)
        except self._errors as exc:
            if _error_code(exc) in _MISSING_CODES:
                raise BlobMissingError(key) from None
            logger.warning("opening a file in the object store failed", exc_info=True)
            raise unavailable("reading a file") from None

        size = int(response.get("ContentLength", -1))

        def reopen(offset: int) -> Any:
            # An object is never rewritten under the same key while it is read (uploads
            # get fresh ids; a batch's output is written after its input is read).
            if offset == size:  # broke off at the very end: a range there is refused
                return io.BytesIO()
            return self._client.get_object(
                Bucket=self._bucket, Key=object_key, Range=f"bytes={offset}-"
            )["Body"]

        reader = _BodyReader(response["Body"], reopen, self._errors)
        return io.BufferedReader(reader, buffer_size=READ_BUFFER_BYTES)

    def delete(self, key: str) -> None:
        """Deletes the object (S3 answers the same for a missing one)."""
        try:
            self._client.delete_object(Bucket=self._bucket, Key=self.object_key(key))
        except self._errors:
            logger.warning("deleting a file from the object store failed", exc_info=True)
            raise unavailable("deleting the file") from None


def s3_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    timeout_s: float,
) -> Any:
    """A boto3 S3 client: short timeouts and few retries, so a store that is down answers
    a request with a 503 in seconds rather than hanging it; path-style addressing for a
    custom endpoint (MinIO and most S3-compatible servers need it)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path" if endpoint_url else "auto"},
    )
    try:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=config,
        )
    except Exception as exc:  # botocore's many ValueErrors: an invalid region name...
        raise FileStoreConfigError(
            f"cannot make an S3 client for {endpoint_url or 'AWS S3'}: {type(exc).__name__}"
        ) from None
