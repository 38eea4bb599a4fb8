"""One engine per disk tier directory: the lock on `kv_disk_path`.

Two engines on one directory would delete each other's files and count them in two
budgets. The second to open finds the lock held and runs without a disk tier (one
warning naming the path), never a crash; once the first closes, a new one opens.
flock is per open file description, so two engines in this one process contend as
two processes would.
"""

from __future__ import annotations

import logging
import pathlib
from typing import cast

import pytest

from engine.kv_cache.disk_format import model_fingerprint
from engine.kv_cache.disk_store import LOCK_NAME, DiskStore
from engine.kv_cache.host_tier import HostTier
from engine.llm_engine import LLMEngine
from tests.engine.prefix_cache.disk_tier_setup import (
    BLOCK,
    PROMPT_A,
    bury_a,
    disk_of,
    run,
    with_l3,
)


def disk_tier_of(engine: LLMEngine) -> object:
    return cast(HostTier, engine.kv.tier).lower


def test_a_second_engine_on_a_locked_directory_runs_without_a_disk_tier(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = with_l3(tiny_model, tmp_path, block_bytes)
    bury_a(first)  # files of a's prompt on disk, which a second engine must not touch
    files = sorted(p.name for p in tmp_path.iterdir())
    with caplog.at_level(logging.WARNING, logger="engine"):
        second = with_l3(tiny_model, tmp_path, block_bytes, disk_blocks=2)
    warned = [
        r.getMessage() for r in caplog.records if "in use by another engine" in r.getMessage()
    ]
    assert len(warned) == 1 and str(tmp_path) in warned[0]
    assert disk_tier_of(second.engine) is None
    assert [t.medium for t in second.engine.stats().kv_tiers] == ["CPU_HOST"]
    # A budget of 2 blocks would have deleted most of the first engine's files at its
    # start scan; it did not scan at all, and it serves (from its own pool only).
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert run(second, PROMPT_A, "t:a").num_cached_tokens == 0
    second.engine.close()
    # The first engine still serves its files.
    assert run(first, PROMPT_A, "t:a").num_cached_tokens == 7 * BLOCK
    first.engine.close()
    # Released on close: a new engine opens the tier and finds the blocks.
    third = with_l3(tiny_model, tmp_path, block_bytes)
    assert len(disk_of(third)) >= 7
    assert run(third, PROMPT_A, "t:a").num_cached_tokens == 7 * BLOCK
    third.engine.close()


def test_the_lock_is_taken_once_released_on_close_and_skipped_by_the_scan(
    tmp_path: pathlib.Path,
) -> None:
    fp = model_fingerprint("rev", ("layout",))
    one, two = DiskStore(tmp_path, fp, 64), DiskStore(tmp_path, fp, 64)
    assert one.lock() and one.lock()  # taken, and taken again by its holder
    assert not two.lock()  # another open file description: refused, no wait
    assert (tmp_path / LOCK_NAME).exists() and one.scan() == []
    one.close()
    one.close()  # idempotent
    assert two.lock()
    two.close()
    assert (tmp_path / LOCK_NAME).exists()  # kept: unlinking it would race a new opener
