"""The file format of the disk KV tier (L3): one file per block, self-describing.

    magic "CLOISTKV", version, model fingerprint (32 bytes), block key (32 bytes),
    wall time of the block's last use, token count, domain length, payload length,
    the block's token ids (int64), its cache domain (UTF-8), the payload (the KV bytes
    of every layer), and a BLAKE2b digest of all that precedes it.

The fingerprint ties a file to one model revision and one KV layout, so a restarted
engine of another model or revision never reads it. The key is the engine's own
chained block hash (rooted at the domain, adapter and revision), never a client's
key, and it names the file. The digest turns a torn, truncated or corrupt file into
a miss: it is checked on every read before a byte of the payload is used.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"CLOISTKV"
VERSION = 1
SUFFIX = ".kvb"
KEY_BYTES = 32
DIGEST_BYTES = 16
# magic, version, fingerprint, key, wall time, tokens, domain bytes, payload bytes
_FIXED = struct.Struct(">8sH32s32sdIIQ")
# Bounds for a header read from disk: a corrupt length must not make us allocate.
MAX_TOKENS = 1 << 16
MAX_DOMAIN_BYTES = 1 << 12
FIXED_BYTES = _FIXED.size
MAX_HEADER_BYTES = FIXED_BYTES + 8 * MAX_TOKENS + MAX_DOMAIN_BYTES


class BadBlockFile(Exception):
    """A block file that cannot be used: torn, truncated, corrupt or not ours."""


class ForeignBlockFile(BadBlockFile):
    """A well-formed block file of another model, revision or KV layout."""


@dataclass(frozen=True)
class BlockRecord:
    """What a block file says about its block, besides the KV bytes."""

    key: bytes
    chunk: tuple[int, ...]
    domain: str
    wall_time: float  # time.time() of the block's last use when it was written


def model_fingerprint(revision: str, layout: Sequence[object]) -> bytes:
    """A digest of the model revision and the KV layout (shapes, dtype, block size)."""
    text = repr((revision, tuple(layout))).encode()
    return hashlib.blake2b(b"kv-disk-tier" + text, digest_size=32).digest()


def file_name(key: bytes) -> str:
    """The name of the file of block `key` in the tier's directory."""
    return key.hex() + SUFFIX


def key_of_name(name: str) -> bytes | None:
    """The key a file name stands for, or None when it is not a block file's name."""
    if not name.endswith(SUFFIX):
        return None
    stem = name[: -len(SUFFIX)]
    if len(stem) != 2 * KEY_BYTES:
        return None
    try:
        return bytes.fromhex(stem)
    except ValueError:
        return None


def encode_header(record: BlockRecord, fingerprint: bytes, payload_len: int) -> bytes:
    """The bytes before the payload."""
    domain = record.domain.encode()
    fixed = _FIXED.pack(
        MAGIC,
        VERSION,
        fingerprint,
        record.key,
        record.wall_time,
        len(record.chunk),
        len(domain),
        payload_len,
    )
    return fixed + struct.pack(f">{len(record.chunk)}q", *record.chunk) + domain


def digest(header: bytes | memoryview, payload: bytes | bytearray | memoryview) -> bytes:
    """The trailing digest of a file made of `header` and `payload`."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(header)
    h.update(payload)
    return h.digest()


def header_length(fixed: bytes | bytearray | memoryview) -> int:
    """The length of a header from its first `FIXED_BYTES` bytes (bounds checked)."""
    if len(fixed) < FIXED_BYTES:
        raise BadBlockFile("truncated header")
    _m, _v, _fp, _k, _w, n, dlen, _p = _FIXED.unpack_from(fixed, 0)
    if n > MAX_TOKENS or dlen > MAX_DOMAIN_BYTES:
        raise BadBlockFile("header out of bounds")
    return int(FIXED_BYTES + 8 * n + dlen)


def parse_header(
    data: bytes | bytearray | memoryview, fingerprint: bytes
) -> tuple[BlockRecord, int, int]:
    """(record, header length, payload length) of a file's leading bytes.

    Raises `ForeignBlockFile` for a file of another model, `BadBlockFile` for one that
    is not a block file or whose header is cut short or out of bounds.
    """
    if len(data) < _FIXED.size:
        raise BadBlockFile("truncated header")
    magic, version, fp, key, wall, n, dlen, plen = _FIXED.unpack_from(data, 0)
    if magic != MAGIC:
        raise BadBlockFile("not a KV block file")
    if version != VERSION or fp != fingerprint:
        raise ForeignBlockFile("another model, revision or format")
    if n > MAX_TOKENS or dlen > MAX_DOMAIN_BYTES:
        raise BadBlockFile("header out of bounds")
    end = _FIXED.size + 8 * n + dlen
    if len(data) < end:
        raise BadBlockFile("truncated header")
    chunk = struct.unpack_from(f">{n}q", data, _FIXED.size)
    try:
        domain = bytes(data[_FIXED.size + 8 * n : end]).decode()
    except UnicodeDecodeError as exc:
        raise BadBlockFile("corrupt domain") from exc
    return BlockRecord(bytes(key), tuple(chunk), domain, float(wall)), end, int(plen)


def decode_block(
    data: bytearray, fingerprint: bytes, key: bytes, payload_len: int
) -> tuple[BlockRecord, memoryview]:
    """The record and payload of a whole file, after checking its key, size and digest."""
    record, start, plen = parse_header(data, fingerprint)
    if record.key != key:
        raise BadBlockFile("the file holds another key than its name says")
    if plen != payload_len or len(data) != start + plen + DIGEST_BYTES:
        raise BadBlockFile("torn or truncated file")
    view = memoryview(data)
    payload = view[start : start + plen]
    if digest(view[:start], payload) != bytes(view[start + plen :]):
        raise BadBlockFile("checksum mismatch")
    return record, payload
