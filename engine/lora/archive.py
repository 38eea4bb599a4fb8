"""A LoRA adapter's folder shipped as a zip: safety checks on its central directory, made
BEFORE anything is inflated, then bounded extraction.

Used wherever an adapter arrives as an archive: the admin API's upload
(admin.adapter_upload) and an engine server's adapter push (engine_server.adapters).

A zip's headers are attacker-controlled: a 2 MB file can claim (or really hold)
gigabytes of zeros, tens of thousands of entries, `../` paths, symlinks, encrypted
or exotically compressed members. Every member is checked against `ArchiveLimits`
first; extraction then streams each member to disk in bounded reads and stops at
the limit whatever the header said, so memory stays flat and the disk use bounded.
"""

from __future__ import annotations

import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from engine.errors import InvalidAdapterError

_CHUNK = 1 << 20

_ENCRYPTED_FLAG = 0x1
_ALLOWED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
# Errors the zipfile/zlib modules raise on corrupt or unsupported data.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError)


class AdapterArchiveError(InvalidAdapterError):
    """The archive is unsafe or unreadable (the message names the first problem)."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds one archive must keep; a PEFT adapter folder is a handful of files."""

    max_entries: int = 64
    max_member_bytes: int = 2 * 1024**3
    max_total_bytes: int = 2 * 1024**3
    # Inflated/compressed size; float16 weights barely compress, a bomb is ~1000x.
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 1 << 20  # small files (JSON) may compress well; ignore the ratio
    # zipfile parses the whole central directory on open, one object per entry, whatever
    # the entry count says: its size is bounded first (a generous 4 KiB per entry).
    max_directory_bytes_per_entry: int = 4096


DEFAULT_LIMITS = ArchiveLimits()


def _check_name(info: zipfile.ZipInfo) -> PurePosixPath:
    raw = info.filename
    name = PurePosixPath(raw)
    if (
        "\\" in raw
        or "\x00" in raw
        or name.is_absolute()
        or ".." in name.parts
        or (name.parts and ":" in name.parts[0])
    ):
        raise AdapterArchiveError(f"unsafe path in archive: {raw!r}")
    return name


def _check_member(info: zipfile.ZipInfo, limits: ArchiveLimits) -> None:
    mode = info.external_attr >> 16
    if info.create_system == 3 and mode and stat.S_IFMT(mode) not in (0, stat.S_IFREG):
        # Unix attributes name a symlink, device, FIFO ...: only regular files are allowed.
        raise AdapterArchiveError(f"archive member {info.filename!r} is not a regular file")
    if info.flag_bits & _ENCRYPTED_FLAG:
        raise AdapterArchiveError(f"archive member {info.filename!r} is encrypted")
    if info.compress_type not in _ALLOWED_METHODS:
        raise AdapterArchiveError(
            f"archive member {info.filename!r} uses an unsupported compression method "
            f"({info.compress_type}); use stored or deflated"
        )
    if info.file_size > limits.max_member_bytes:
        raise AdapterArchiveError(f"archive member {info.filename!r} is too large")
    if info.file_size > limits.ratio_floor_bytes and info.file_size > limits.max_ratio * max(
        info.compress_size, 1
    ):
        raise AdapterArchiveError(
            f"archive member {info.filename!r} has a suspicious compression ratio"
        )


_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"


def central_directory_size(path: Path) -> int:
    """The central directory's size from the end records (zip64 too), read without zipfile."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - (22 + 0xFFFF)))  # the record, then a comment of up to 64 KiB
        tail = f.read()
        at = tail.rfind(_EOCD)
        if at < 0 or len(tail) - at < 22:
            raise AdapterArchiveError("not a readable zip archive")
        (directory,) = struct.unpack_from("<I", tail, at + 12)
        if directory != 0xFFFFFFFF:
            return int(directory)
        locator = at - 20
        if locator < 0 or tail[locator : locator + 4] != _ZIP64_LOCATOR:
            raise AdapterArchiveError("not a readable zip archive")
        (record_at,) = struct.unpack_from("<Q", tail, locator + 8)
        if record_at > size - 56:
            raise AdapterArchiveError("not a readable zip archive")
        f.seek(record_at)
        record = f.read(56)
        if len(record) < 56 or record[:4] != _ZIP64_EOCD:
            raise AdapterArchiveError("not a readable zip archive")
        return int(struct.unpack_from("<Q", record, 40)[0])


def open_archive(
    path: Path, limits: ArchiveLimits
) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    """The open archive and its file members (folders skipped), every one checked."""
    if central_directory_size(path) > limits.max_entries * limits.max_directory_bytes_per_entry:
        raise AdapterArchiveError(
            f"archive has too many entries; at most {limits.max_entries} are allowed"
        )
    try:
        archive = zipfile.ZipFile(path)
    except (*ZIP_ERRORS, ValueError, OSError) as exc:
        raise AdapterArchiveError("not a readable zip archive") from exc
    try:
        entries = archive.infolist()
        if len(entries) > limits.max_entries:
            raise AdapterArchiveError(
                f"archive has {len(entries)} entries; at most {limits.max_entries} are allowed"
            )
        members: list[zipfile.ZipInfo] = []
        seen: set[str] = set()
        total = 0
        for info in entries:
            name = _check_name(info)
            if info.is_dir():
                continue
            _check_member(info, limits)
            if name.name in seen:
                raise AdapterArchiveError(f"archive holds {name.name!r} twice")
            seen.add(name.name)
            total += info.file_size
            if total > limits.max_total_bytes:
                raise AdapterArchiveError("archive too large when unpacked")
            members.append(info)
    except BaseException:
        archive.close()
        raise
    return archive, members


def _copy_bounded(source: IO[bytes], target: IO[bytes], cap: int, what: str) -> int:
    written = 0
    while True:
        chunk = source.read(min(_CHUNK, cap + 1 - written))
        if not chunk:
            return written
        written += len(chunk)
        if written > cap:
            raise AdapterArchiveError(f"archive member {what!r} is larger than it declares")
        target.write(chunk)


def extract_members(path: Path, folder: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> list[Path]:
    """Checks the archive at `path`, then writes its files flat into `folder` (which must exist).

    A member never yields more than its declared size (nor the limits): its bytes are
    read at most cap + 1 at a time and the copy stops there; a CRC or inflate error is
    an AdapterArchiveError like any other defect.
    """
    archive, members = open_archive(path, limits)
    written: list[Path] = []
    remaining = limits.max_total_bytes
    with archive:
        for info in members:
            target = folder / PurePosixPath(info.filename).name
            cap = min(info.file_size, limits.max_member_bytes, remaining)
            try:
                with archive.open(info) as source, target.open("xb") as out:
                    remaining -= _copy_bounded(source, out, cap, info.filename)
            except AdapterArchiveError:
                raise
            except (*ZIP_ERRORS, RuntimeError, ValueError) as exc:
                # zipfile's own text names internals; the caller learns what is wrong.
                raise AdapterArchiveError(
                    f"archive member {info.filename!r} is corrupt (bad CRC or compressed data)"
                ) from exc
            written.append(target)
    return written
