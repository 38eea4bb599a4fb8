"""The disk tier's block files: what a reader accepts, and every way it refuses."""

from __future__ import annotations

import pathlib

import pytest

from engine.kv_cache.disk_format import (
    BadBlockFile,
    BlockRecord,
    ForeignBlockFile,
    decode_block,
    digest,
    encode_header,
    file_name,
    key_of_name,
    model_fingerprint,
)

FP = model_fingerprint("rev-1", (2, (8, 2, 16), "torch.float32", 8))
KEY = bytes(range(32))
RECORD = BlockRecord(KEY, tuple(range(8)), "t:a/k:1", 1.5e9)
PAYLOAD = bytes(range(256)) * 4


def whole(record: BlockRecord = RECORD, fp: bytes = FP, payload: bytes = PAYLOAD) -> bytearray:
    header = encode_header(record, fp, len(payload))
    return bytearray(header + payload + digest(header, payload))


def test_a_whole_file_reads_back() -> None:
    record, payload = decode_block(whole(), FP, KEY, len(PAYLOAD))
    assert record == RECORD and bytes(payload) == PAYLOAD
    assert key_of_name(file_name(KEY)) == KEY
    assert key_of_name("notes.txt") is None and key_of_name("zz" * 32 + ".kvb") is None


def test_another_revision_or_layout_is_foreign() -> None:
    other_rev = model_fingerprint("rev-2", (2, (8, 2, 16), "torch.float32", 8))
    other_dtype = model_fingerprint("rev-1", (2, (8, 2, 16), "torch.bfloat16", 8))
    for fp in (other_rev, other_dtype):
        assert fp != FP
        with pytest.raises(ForeignBlockFile):
            decode_block(whole(fp=fp), FP, KEY, len(PAYLOAD))


@pytest.mark.parametrize("where", [0, 20, 100, 200, -300, -1])
def test_any_flipped_byte_is_refused(where: int) -> None:
    data = whole()
    data[where] ^= 0x40
    with pytest.raises(BadBlockFile):
        decode_block(data, FP, KEY, len(PAYLOAD))


@pytest.mark.parametrize("keep", [0, 10, 97, 150, 600, 1100])
def test_a_truncated_file_is_refused(keep: int) -> None:
    data = whole()
    assert keep < len(data)
    with pytest.raises(BadBlockFile):
        decode_block(data[:keep], FP, KEY, len(PAYLOAD))


def test_a_file_under_another_keys_name_or_size_is_refused() -> None:
    with pytest.raises(BadBlockFile):
        decode_block(whole(), FP, bytes(32), len(PAYLOAD))
    with pytest.raises(BadBlockFile):
        decode_block(whole(), FP, KEY, len(PAYLOAD) + 1)


def test_a_slow_disk_skips_blocks_instead_of_holding_them_without_bound(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from engine.kv_cache import disk_store
    from engine.kv_cache.disk_store import DiskStore

    monkeypatch.setattr(disk_store, "MAX_PENDING_BYTES", 3 * len(PAYLOAD))
    gate = threading.Event()
    real = DiskStore._write_file

    def slow(self: DiskStore, key: bytes, header: bytes, payload: bytes) -> None:
        gate.wait(10)
        real(self, key, header, payload)

    monkeypatch.setattr(DiskStore, "_write_file", slow)
    store = DiskStore(tmp_path, FP, len(PAYLOAD))
    records = [BlockRecord(bytes([i]) * 32, (i,), "t:a", 0.0) for i in range(5)]
    accepted = [store.write(r, PAYLOAD) for r in records]
    assert accepted == [True, True, True, False, False] and store.skipped == 2
    assert store.read(records[1].key) is not None  # queued bytes are served meanwhile
    gate.set()
    store.flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        file_name(r.key) for r in records[:3]
    )
    assert store.read(records[4].key) is None
    store.close()
