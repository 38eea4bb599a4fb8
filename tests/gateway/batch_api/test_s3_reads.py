"""Reading an object whose connection breaks off (which moto cannot stage): the read
resumes from the same byte with a ranged GET; a resume that gets nothing is the store's
503."""

from __future__ import annotations

import io
from typing import Any

import pytest
from botocore.exceptions import ResponseStreamingError

from gateway.batch_api.blob_store import FileStoreUnavailableError
from gateway.batch_api.s3_blob_store import S3BlobStore

DATA = b"".join(b'{"line": %d}\n' % i for i in range(5000))


class _BreakingBody(io.BytesIO):
    """A body that breaks off after `limit` bytes, as a dropped connection does."""

    def __init__(self, data: bytes, limit: int) -> None:
        super().__init__(data)
        self._left = limit

    def read(self, size: int | None = -1) -> bytes:
        if self._left <= 0:
            raise ResponseStreamingError(error="connection reset by peer")
        chunk = super().read(min(self._left, size if size and size > 0 else self._left))
        self._left -= len(chunk)
        return chunk


class _Client:
    """get_object only: each body breaks off after `breaks_after[i]` bytes."""

    def __init__(self, breaks_after: list[int]) -> None:
        self.breaks_after = breaks_after
        self.ranges: list[str | None] = []

    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        self.ranges.append(Range)
        start = int(Range.removeprefix("bytes=").rstrip("-")) if Range else 0
        limit = self.breaks_after.pop(0) if self.breaks_after else len(DATA)
        return {"Body": _BreakingBody(DATA[start:], limit), "ContentLength": len(DATA)}


def _store(client: _Client) -> S3BlobStore:
    return S3BlobStore(client, bucket="b", prefix="p", endpoint_url="http://s3.test")


def test_a_read_that_breaks_off_resumes_from_the_same_byte() -> None:
    client = _Client(breaks_after=[10_000])
    with _store(client).open("tenant/file-1") as stream:
        assert stream.read() == DATA
    assert client.ranges == [None, "bytes=10000-"]


def test_lines_read_across_a_break_are_whole_and_in_order() -> None:
    client = _Client(breaks_after=[777])
    with _store(client).open("tenant/file-1") as stream:
        assert list(stream) == DATA.splitlines(keepends=True)


def test_a_resume_that_breaks_at_once_is_the_stores_503() -> None:
    client = _Client(breaks_after=[10_000, 0])
    with (
        _store(client).open("tenant/file-1") as stream,
        pytest.raises(FileStoreUnavailableError) as caught,
    ):
        stream.read()
    assert caught.value.status == 503 and caught.value.code == "file_store_unavailable"
