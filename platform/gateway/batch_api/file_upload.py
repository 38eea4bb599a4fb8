"""An upload of `POST /v1/files`: multipart/form-data streamed to disk under caps.

The openai SDK sends the file as a multipart part named "file" and the purpose as a
field "purpose". The body is parsed as it arrives (python-multipart's push parser),
the file part is written to a staging file chunk by chunk, and both caps are checked
as bytes come in: a Content-Length over the size cap is refused before a byte is
read, and a body that turns out larger, or a file with more lines than allowed, is
refused as soon as it passes, so an oversized upload never fills the disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from gateway.batch_api.errors import UploadTooLargeError
from gateway.errors import InvalidParameterError

MAX_FIELD_BYTES = 1024  # "purpose" and any other small field
MAX_FILENAME_CHARS = 256
# Multipart framing (boundaries, part headers) around the file's own bytes.
FRAMING_ALLOWANCE = 64 * 1024


@dataclass(frozen=True)
class ReceivedUpload:
    """What an upload held: the file's name, its bytes and lines (on disk), the purpose."""

    filename: str
    purpose: str | None
    size: int
    lines: int
    ends_with_newline: bool


@dataclass
class _Part:
    name: str | None = None
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _Receiver:
    """The parser's callbacks: collects small fields, queues the file part's bytes."""

    def __init__(self, max_bytes: int, max_lines: int) -> None:
        self._max_bytes = max_bytes
        self._max_lines = max_lines
        self._part = _Part()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._pending: list[bytes] = []  # file bytes parsed but not yet written
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.size = 0
        self.newlines = 0
        self.last_byte = b""
        self.files = 0

    def on_part_begin(self) -> None:
        self._part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if bytes(self._header_field).lower() == b"content-disposition":
            _, options = parse_options_header(bytes(self._header_value))
            name = options.get(b"name")
            filename = options.get(b"filename")
            self._part.name = name.decode("utf-8", "replace") if name is not None else None
            if filename is not None:
                self._part.filename = filename.decode("utf-8", "replace")
        self._header_field.clear()
        self._header_value.clear()

    def on_headers_finished(self) -> None:
        if self._part.name == "file":
            self.files += 1
            if self.files > 1:
                raise InvalidParameterError("send one file per upload", param="file")
            self.filename = self._part.filename or "upload.jsonl"

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if not chunk:
            return
        if self._part.name == "file":
            self.size += len(chunk)
            if self.size > self._max_bytes:
                raise UploadTooLargeError(
                    f"the file is larger than {self._max_bytes} bytes",
                    param="file",
                    code="file_too_large",
                )
            self.newlines += chunk.count(b"\n")
            if self.newlines > self._max_lines:
                raise UploadTooLargeError(
                    f"the file has more than {self._max_lines} lines",
                    param="file",
                    code="too_many_lines",
                )
            self.last_byte = chunk[-1:]
            self._pending.append(chunk)
            return
        self._part.data += chunk
        if len(self._part.data) > MAX_FIELD_BYTES:
            raise InvalidParameterError(
                f"the form field {self._part.name!r} is too long", param=self._part.name
            )

    def on_part_end(self) -> None:
        name = self._part.name
        if name is not None and name != "file":
            self.fields[name] = self._part.data.decode("utf-8", "replace")

    def take_pending(self) -> list[bytes]:
        """The file bytes parsed since the last call (written off the event loop)."""
        pending, self._pending = self._pending, []
        return pending


def _boundary(request: Request) -> bytes:
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidParameterError(
            "send the file as multipart/form-data (fields: file, purpose)", param="file"
        )
    return boundary


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        raise InvalidParameterError("the Content-Length header is not a number")
    return int(value)


async def receive_upload(
    request: Request, staged: Path, *, max_bytes: int, max_lines: int
) -> ReceivedUpload:
    """Parses the upload into `staged` (created); refuses it as soon as it passes a cap."""
    boundary = _boundary(request)
    declared = _declared_length(request)
    if declared is not None and declared > max_bytes + FRAMING_ALLOWANCE:
        raise UploadTooLargeError(
            f"the file is larger than {max_bytes} bytes", param="file", code="file_too_large"
        )
    out = await anyio.to_thread.run_sync(staged.open, "xb")
    receiver = _Receiver(max_bytes, max_lines)
    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": receiver.on_part_begin,
            "on_header_field": receiver.on_header_field,
            "on_header_value": receiver.on_header_value,
            "on_header_end": receiver.on_header_end,
            "on_headers_finished": receiver.on_headers_finished,
            "on_part_data": receiver.on_part_data,
            "on_part_end": receiver.on_part_end,
        },
    )
    try:
        async for chunk in request.stream():
            try:
                parser.write(chunk)
            except MultipartParseError as exc:
                raise InvalidParameterError(
                    "the multipart body is malformed", param="file"
                ) from exc
            pending = receiver.take_pending()
            if pending:
                await anyio.to_thread.run_sync(out.write, b"".join(pending))
        parser.finalize()
    finally:
        await anyio.to_thread.run_sync(out.close)
    if receiver.files == 0:
        raise InvalidParameterError("the upload has no file part named 'file'", param="file")
    # Control characters (a NUL above all, which PostgreSQL refuses) never reach a row.
    printable = "".join(c for c in receiver.filename or "" if c >= " " and c != "\x7f")
    filename = (printable or "upload.jsonl")[:MAX_FILENAME_CHARS]
    ends = receiver.last_byte == b"\n"
    lines = receiver.newlines + (0 if ends or receiver.size == 0 else 1)
    if lines > max_lines:
        raise UploadTooLargeError(
            f"the file has more than {max_lines} lines", param="file", code="too_many_lines"
        )
    return ReceivedUpload(
        filename=filename,
        purpose=receiver.fields.get("purpose"),
        size=receiver.size,
        lines=lines,
        ends_with_newline=ends,
    )
