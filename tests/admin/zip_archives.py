"""Adapter archives for the upload tests: valid ones, bombs and every malformed shape.

Built in memory by hand where zipfile would refuse to write them (lying headers,
symlink members, encryption flags, unknown compression methods).
"""

from __future__ import annotations

import io
import json
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 16, 32, 2, 1  # head_dim 8: q_out 16, kv_out 8
GIB = 1024**3


def adapter_files(config: dict[str, Any] | None = None, rank: int = 4) -> dict[str, bytes]:
    """A valid PEFT adapter for the base model: q_proj A [r, 16], B [16, r]."""
    cfg = {"r": rank, "base_model_name_or_path": "base", "peft_type": "LORA", "lora_alpha": 8}
    weights = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros(
            (rank, HIDDEN), np.float16
        ),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros(
            (HIDDEN, rank), np.float16
        ),
    }
    return {
        "adapter_config.json": json.dumps(cfg if config is None else config).encode(),
        "adapter_model.safetensors": save(weights),
    }


def zip_of(files: dict[str, bytes], *, folder: str = "") -> bytes:
    """An ordinary deflated zip of `files`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(folder + name, data)
    return buf.getvalue()


@dataclass(frozen=True)
class RawEntry:
    """One member of a hand-built zip: its headers say exactly what the fields say."""

    name: str
    data: bytes  # as stored (already compressed for method 8)
    crc: int
    file_size: int
    method: int = zipfile.ZIP_STORED
    flags: int = 0
    external_attr: int = 0


def raw_zip(entries: list[RawEntry]) -> bytes:
    """A zip written header by header, so that headers can lie or carry odd flags."""
    out, central = bytearray(), bytearray()
    for e in entries:
        name = e.name.encode()
        offset = len(out)
        # The fields both headers carry: version needed, flags, method, time, date, CRC,
        # compressed and uncompressed size, name length, extra length.
        shared = (20, e.flags, e.method, 0, 0x21, e.crc, len(e.data), e.file_size, len(name), 0)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, *shared)
        out += name + e.data
        # Central: made by (Unix, 2.0), the shared fields, comment length, disk, internal
        # and external attributes, and the local header's offset.
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            (3 << 8) | 20,
            *shared,
            0,
            0,
            0,
            e.external_attr,
            offset,
        )
        central += name
    n = len(entries)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), len(out), 0)
    return bytes(out + central + eocd)


def zeros_deflated(mib: int) -> bytes:
    """A raw deflate stream of `mib` MiB of zeros, built in O(1 MiB) of work: after a full
    flush the compressor's output for the same input repeats byte for byte."""
    chunk = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    repeat = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    return first + repeat * (mib - 1) + c.flush(zlib.Z_FINISH)


def stored(name: str, data: bytes, **fields: Any) -> RawEntry:
    """An uncompressed member with a correct CRC unless `fields` say otherwise."""
    values: dict[str, Any] = {"crc": zlib.crc32(data), "file_size": len(data)}
    values.update(fields)
    return RawEntry(name, data, **values)


def valid_entries() -> list[RawEntry]:
    """The valid adapter as raw members."""
    return [stored(name, data) for name, data in adapter_files().items()]


def bomb() -> bytes:
    """1 GiB of zeros in ~1 MiB, honestly declared (the CRC is not worth computing)."""
    return raw_zip(
        [
            *valid_entries()[:1],
            RawEntry(
                "adapter_model.safetensors", zeros_deflated(1024), 0, GIB, zipfile.ZIP_DEFLATED
            ),
        ]
    )


def lying_bomb() -> bytes:
    """A member whose header claims 4 KiB while its data inflates to 1 GiB."""
    return raw_zip(
        [
            *valid_entries()[:1],
            RawEntry(
                "adapter_model.safetensors", zeros_deflated(1024), 0, 4096, zipfile.ZIP_DEFLATED
            ),
        ]
    )


def many_entries(count: int = 50_000) -> bytes:
    """A valid adapter followed by `count` empty files."""
    empty = [stored(f"f{i}", b"") for i in range(count)]
    return raw_zip(valid_entries() + empty)


def with_config(config: dict[str, Any] | str) -> bytes:
    """The valid adapter with adapter_config.json replaced (a str is written verbatim)."""
    files = adapter_files()
    files["adapter_config.json"] = (
        config.encode() if isinstance(config, str) else json.dumps(config).encode()
    )
    return zip_of(files)


def with_extra(entry: RawEntry) -> bytes:
    """The valid adapter plus one more raw member."""
    return raw_zip([*valid_entries(), entry])


def _config(**changes: Any) -> dict[str, Any]:
    cfg = {"r": 4, "base_model_name_or_path": "base", "peft_type": "LORA"}
    cfg.update(changes)
    return cfg


HOSTILE: dict[str, Callable[[], bytes]] = {
    "zip_bomb": bomb,
    "lying_header_bomb": lying_bomb,
    "50k_entries": many_entries,
    "dotdot_path": lambda: with_extra(stored("../evil.json", b"{}")),
    "backslash_dotdot_path": lambda: with_extra(stored("..\\evil.json", b"{}")),
    "absolute_path": lambda: with_extra(stored("/tmp/evil.json", b"{}")),
    "drive_path": lambda: with_extra(stored("C:/evil.json", b"{}")),
    "symlink_member": lambda: with_extra(
        stored("README.md", b"/etc/passwd", external_attr=(stat.S_IFLNK | 0o777) << 16)
    ),
    "fifo_member": lambda: with_extra(
        stored("README.md", b"", external_attr=(stat.S_IFIFO | 0o644) << 16)
    ),
    "encrypted_flag": lambda: raw_zip(
        [valid_entries()[0], stored("adapter_model.safetensors", b"x" * 64, flags=0x1)]
    ),
    "crc_error": lambda: raw_zip(
        [valid_entries()[0], stored("adapter_model.safetensors", b"x" * 64, crc=1234)]
    ),
    "unknown_compression_method": lambda: raw_zip(
        [valid_entries()[0], stored("adapter_model.safetensors", b"x" * 64, method=99)]
    ),
    "corrupt_deflate": lambda: raw_zip(
        [
            valid_entries()[0],
            stored(
                "adapter_model.safetensors",
                b"\xff" * 64,
                crc=0,
                file_size=64,
                method=zipfile.ZIP_DEFLATED,
            ),
        ]
    ),
    "duplicate_names": lambda: raw_zip([*valid_entries(), valid_entries()[0]]),
    "not_a_zip": lambda: b"not a zip",
    "truncated_zip": lambda: zip_of(adapter_files())[:-30],
    "rank_1e999": lambda: with_config('{"r": 1e999, "base_model_name_or_path": "base"}'),
    "rank_float": lambda: with_config(_config(r=4.0)),
    "rank_string": lambda: with_config(_config(r="4")),
    "rank_huge": lambda: with_config(_config(r=10**30)),
    "alpha_1e999": lambda: with_config(
        '{"r": 4, "base_model_name_or_path": "base", "lora_alpha": 1e999}'
    ),
    "nan_constant": lambda: with_config(
        '{"r": 4, "base_model_name_or_path": "base", "lora_alpha": NaN}'
    ),
    "nested_config": lambda: with_config(
        '{"r": 4, "base_model_name_or_path": "base", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    ),
    "config_not_object": lambda: with_config("[4]"),
    "base_not_string": lambda: with_config(_config(base_model_name_or_path=["base"])),
    "config_not_utf8": lambda: zip_of({**adapter_files(), "adapter_config.json": b"\xff\xfe{"}),
    "weights_not_safetensors": lambda: zip_of(
        {**adapter_files(), "adapter_model.safetensors": b"\xff" * 100}
    ),
}
