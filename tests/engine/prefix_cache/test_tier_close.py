"""At shutdown the host tier (L2) spills what it holds to the disk tier (L3).

Without it a restart loses every block that was in host memory only, which is the
most recent part of the cache. Same engine set-up as test_disk_tier.py, but with a
host tier large enough that b's flood pushes a's prompt into host memory only.
"""

from __future__ import annotations

import logging
import pathlib
import time

import pytest

from engine.kv_cache import disk_store
from engine.kv_cache.disk_store import DiskStore
from tests.engine.prefix_cache.disk_tier_setup import (
    BLOCK,
    FLOOD_2,
    FLOOD_B,
    PROMPT_A,
    block_files,
    disk_of,
    files_by_block,
    host_of,
    run,
    settle,
    with_l3,
)


def test_blocks_in_host_memory_are_spilled_at_close_and_found_after_a_restart(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, host_blocks=32)
    first = run(llm, PROMPT_A, "t:a")
    # Two floods of a's own push all of its prompt off the device (a's floor keeps
    # a's newest blocks) into host memory, which has room for all of it.
    run(llm, FLOOD_B, "t:a")
    run(llm, FLOOD_2, "t:a")
    settle(llm)
    host = host_of(llm)
    assert {k for k, e in host._by_key.items() if e.chunk == tuple(PROMPT_A[:BLOCK])}
    assert files_by_block(llm, tmp_path, PROMPT_A) == {}  # in L2 only, nothing on disk
    llm.engine.close()
    assert files_by_block(llm, tmp_path, PROMPT_A).keys() == set(range(7))
    restarted = with_l3(tiny_model, tmp_path, block_bytes, host_blocks=32)
    # Another tenant with the identical prompt finds none of it; a finds its blocks.
    assert run(restarted, PROMPT_A, "t:c").num_cached_tokens == 0
    again = run(restarted, PROMPT_A, "t:a")
    assert again.num_cached_tokens == 7 * BLOCK
    assert disk_of(restarted).stats().loads == 7
    # The bytes spilled are the block's own: the same logits as the first run's.
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    got, ref = again.outputs[0].logprobs, first.outputs[0].logprobs
    assert got is not None and ref is not None
    for a, b in zip(got, ref, strict=True):
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
        assert [t.logprob for t in a.top] == pytest.approx([t.logprob for t in b.top], abs=1e-4)
    restarted.engine.kv.check_integrity()
    restarted.engine.close()


def test_the_spill_at_close_keeps_to_the_disk_budget(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, host_blocks=16, disk_blocks=3)
    run(llm, PROMPT_A, "t:a")
    run(llm, FLOOD_B, "t:b")
    settle(llm)
    assert len(host_of(llm)) > 3
    llm.engine.close()
    # Full, and no fuller: the spill made room within the budget as any spill does.
    assert len(block_files(tmp_path)) == len(disk_of(llm)) == 3


def test_the_writer_drains_with_a_timeout(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A disk that takes too long: close returns after the timeout and the current file,
    dropping the queued writes (a miss later), with one warning; deletes still run."""
    from engine.kv_cache.disk_format import BlockRecord, file_name, model_fingerprint

    def slow(self: DiskStore, key: bytes, header: bytes, payload: bytes) -> None:
        time.sleep(0.5)
        (self.root / file_name(key)).write_bytes(header + payload)

    monkeypatch.setattr(DiskStore, "_write_file", slow)
    store = DiskStore(tmp_path, model_fingerprint("rev", ("l",)), 8)
    assert store.lock()
    keys = [bytes([i]) * 32 for i in range(20)]
    for k in keys:
        store.write(BlockRecord(k, (1,), "t:a", 0.0), b"x" * 8)
    (tmp_path / file_name(b"\xee" * 32)).write_bytes(b"old")
    store.delete(b"\xee" * 32)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="engine"):
        store.close(timeout_s=0.3)
    assert time.monotonic() - started < 5.0  # not 20 x 0.5 s
    written = [k for k in keys if (tmp_path / file_name(k)).exists()]
    assert 1 <= len(written) < len(keys)
    assert not (tmp_path / file_name(b"\xee" * 32)).exists()
    assert sum("did not take its last writes" in r.getMessage() for r in caplog.records) == 1


def test_a_full_backlog_waits_for_room_while_draining(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In serving, a write past the backlog is skipped; while draining it waits."""
    from engine.kv_cache.disk_format import BlockRecord, file_name, model_fingerprint

    monkeypatch.setattr(disk_store, "MAX_PENDING_BYTES", 16)
    store = DiskStore(tmp_path, model_fingerprint("rev", ("l",)), 8)
    store.drain_until(time.monotonic() + 10.0)
    keys = [bytes([i]) * 32 for i in range(10)]
    assert all(store.write(BlockRecord(k, (1,), "t:a", 0.0), b"x" * 8) for k in keys)
    store.close()
    assert store.skipped == 0
    assert all((tmp_path / file_name(k)).exists() for k in keys)
