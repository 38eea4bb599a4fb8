"""The local-disk KV tier (L3) at the engine API, on a tiny random-weight model.

As in test_host_tier.py: a pool of 12 blocks of 8 tokens, a 58-token prompt of
tenant a (7 full blocks) and an 80-token flood of tenant b that evicts a's blocks.
Here the host tier (L2) holds one block only, so what the pool evicts passes through
it and is spilled to the disk tier, in files under a temporary directory. That set-up
is disk_tier_setup.py's (and conftest.py's fixtures), shared with the tests beside this one.
"""

from __future__ import annotations

import logging
import pathlib
from typing import cast

import pytest

from engine import LLM
from engine.kv_cache.host_setup import disk_file_bytes
from engine.kv_cache.host_tier import HostTier
from engine.llm_engine import LLMEngine
from tests.engine.prefix_cache.disk_tier_setup import (
    BLOCK,
    FLOOD_B,
    PROMPT_A,
    block_files,
    bury_a,
    disk_of,
    files_by_block,
    run,
    settle,
    spill_a,
    with_l3,
)
from tests.utils.tiny_model import make_tiny_model_dir


def test_blocks_evicted_to_disk_load_back_with_identical_logits(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    recompute = LLM(str(tiny_model), num_blocks=64, block_size=BLOCK, prefix_cache="off")
    ref = run(recompute, PROMPT_A, "t:a")
    roomy = LLM(str(tiny_model), num_blocks=64, block_size=BLOCK)
    run(roomy, PROMPT_A, "t:a")
    device_hit = run(roomy, PROMPT_A, "t:a")
    assert device_hit.num_cached_tokens == 56
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    first = run(llm, PROMPT_A, "t:a")
    run(llm, FLOOD_B, "t:b")
    settle(llm)
    disk = disk_of(llm)
    assert disk.domain_blocks().get("t:a", 0) >= 5  # all but the floor's and L2's block
    assert len(files_by_block(llm, tmp_path, PROMPT_A)) == disk.domain_blocks()["t:a"]
    again = run(llm, PROMPT_A, "t:a")
    assert again.num_cached_tokens == 56
    assert disk.stats().loads >= 5
    assert again.outputs[0].token_ids == ref.outputs[0].token_ids == first.outputs[0].token_ids
    got, hit, full = (r.outputs[0].logprobs for r in (again, device_hit, ref))
    assert got is not None and hit is not None and full is not None
    assert got == hit  # the bytes the first request computed, to the last bit
    for a, b in zip(got, full, strict=True):
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
        assert [t.logprob for t in a.top] == pytest.approx([t.logprob for t in b.top], abs=1e-4)
    llm.engine.kv.check_integrity()
    tiers = llm.engine.stats().kv_tiers
    assert [t.medium for t in tiers] == ["CPU_HOST", "DISK"]
    assert tiers[1].loads == disk.stats().loads and tiers[1].write_backs >= 5


def test_a_fetch_that_is_skipped_would_change_the_logits(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above can fail: a disk block that never reaches its host slot gives
    other logits (the slot holds another block's bytes)."""
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    first = run(llm, PROMPT_A, "t:a")
    run(llm, FLOOD_B, "t:b")
    settle(llm)
    buffer = llm.engine.host_kv
    assert buffer is not None
    real = buffer._disk_op
    monkeypatch.setattr(buffer, "_disk_op", lambda op: None if op.kind == "fetch" else real(op))
    again = run(llm, PROMPT_A, "t:a")
    assert again.num_cached_tokens == 56
    assert again.outputs[0].logprobs != first.outputs[0].logprobs


@pytest.mark.parametrize("drop_domain", [False, True])
def test_two_tenants_never_find_each_others_blocks_on_disk_also_after_restart(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
    drop_domain: bool,
) -> None:
    if drop_domain:
        # The bug this test is for: a key without the domain (as SGLang's host and disk
        # pages had). Then another tenant's lookup must hit a's files, and it does.
        from engine.kv_cache.cache_key import CacheKey

        derive = CacheKey.derive.__func__  # type: ignore[attr-defined]
        monkeypatch.setattr(
            CacheKey, "derive", classmethod(lambda cls, _d, a, r: derive(cls, "shared", a, r))
        )
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    bury_a(llm)  # the whole of a's chain on disk, the device and L2 hold other blocks
    disk = disk_of(llm)
    c = run(llm, PROMPT_A, "t:c")
    if drop_domain:
        assert c.num_cached_tokens > 8
        return
    hits = disk.stats().hit_blocks
    k = run(llm, PROMPT_A, "t:a/k:1")  # another key of tenant a: another domain
    assert c.num_cached_tokens == 0 and k.num_cached_tokens == 0
    assert disk.stats().hit_blocks == hits
    settle(llm)
    llm.engine.close()  # a restart: the directory's lock goes with the old engine
    # A new engine over the same directory: only a finds a's blocks. (t:c and t:a/k:1
    # cached the prompt under their own keys above, and may find those: two domains
    # that never ran it ask here.)
    again = with_l3(tiny_model, tmp_path, block_bytes)
    assert disk_of(again).domain_blocks().get("t:a", 0) >= 7
    assert run(again, PROMPT_A, "t:d").num_cached_tokens == 0
    assert run(again, PROMPT_A, "t:a/k:2").num_cached_tokens == 0
    assert run(again, PROMPT_A, "t:a").num_cached_tokens == 56
    again.engine.kv.check_integrity()


def test_a_restarted_engine_finds_its_blocks_with_identical_logits(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    roomy = LLM(str(tiny_model), num_blocks=64, block_size=BLOCK)
    run(roomy, PROMPT_A, "t:a")
    device_hit = run(roomy, PROMPT_A, "t:a")
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    bury_a(llm)
    llm.engine.close()  # which also spills the host tier's block
    on_disk = len(block_files(tmp_path))
    restarted = with_l3(tiny_model, tmp_path, block_bytes)
    disk = disk_of(restarted)
    assert len(disk) == on_disk
    out = run(restarted, PROMPT_A, "t:a")
    # The new engine's pool and host tier start empty: every cached token came from disk.
    assert out.num_cached_tokens == 56 and disk.stats().loads == 7
    assert out.outputs[0].logprobs == device_hit.outputs[0].logprobs
    restarted.engine.kv.check_integrity()


def test_another_models_files_are_ignored_and_deleted(
    tiny_model: pathlib.Path,
    tmp_path_factory: pytest.TempPathFactory,
    block_bytes: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path_factory.mktemp("shared_l3")
    llm = with_l3(tiny_model, path, block_bytes)
    spill_a(llm)
    ours = block_files(path)
    assert len(ours) >= 5
    (path / "notes.txt").write_text("not a block file")  # not ours: left alone
    llm.engine.close()
    other = make_tiny_model_dir(tmp_path_factory.mktemp("other_model"), seed=1)
    with caplog.at_level(logging.WARNING, logger="engine"):
        second = with_l3(other, path, block_bytes)
    assert len(disk_of(second)) == 0
    assert block_files(path) == [] and (path / "notes.txt").exists()
    assert any("another model" in r.getMessage() for r in caplog.records)
    assert run(second, PROMPT_A, "t:a").num_cached_tokens == 0


def test_a_corrupt_or_truncated_file_is_a_miss(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    reference = bury_a(llm)
    files = files_by_block(llm, tmp_path, PROMPT_A)
    # Block 3: one bit flipped in its KV bytes (the digest catches it at the read);
    # block 5: cut short (the size check catches it at the restart's scan).
    data = bytearray(files[3].read_bytes())
    data[-100] ^= 0x01
    files[3].write_bytes(bytes(data))
    files[5].write_bytes(files[5].read_bytes()[:-7])
    llm.engine.close()
    restarted = with_l3(tiny_model, tmp_path, block_bytes)
    disk = disk_of(restarted)
    assert not files[5].exists()  # deleted at start
    out = run(restarted, PROMPT_A, "t:a")
    assert out.num_cached_tokens == 3 * BLOCK  # blocks 0-2 from disk, the rest computed
    assert disk.stats().loads == 3 and disk.counters.bad_files == 1
    settle(restarted)
    assert not files[3].exists()  # a bad file is deleted
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids
    assert out.outputs[0].logprobs is not None and reference.outputs[0].logprobs is not None
    for a, b in zip(out.outputs[0].logprobs, reference.outputs[0].logprobs, strict=True):
        assert [t.logprob for t in a.top] == pytest.approx([t.logprob for t in b.top], abs=1e-4)
    restarted.engine.kv.check_integrity()


def test_never_cache_writes_no_file(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    run(llm, PROMPT_A, "t:a", use_cache=False)
    run(llm, FLOOD_B, "t:b", use_cache=False)
    run(llm, list(range(300, 380)), "t:b", use_cache=False)
    settle(llm)
    assert disk_of(llm).stats().write_backs == 0 and block_files(tmp_path) == []
    spill_a(llm)  # the same engine does write what may be cached
    assert block_files(tmp_path)


def test_scrub_and_ttl_leave_no_file(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, scrub_freed_blocks=True, retention_ttl_s=60.0)
    engine = llm.engine
    now = [1000.0]
    engine.kv.clock = lambda: now[0]
    spill_a(llm)
    disk = disk_of(llm)
    held = disk.domain_blocks().get("t:a", 0)
    assert held >= 5 and len(files_by_block(llm, tmp_path, PROMPT_A)) == held
    now[0] += 61.0
    out = run(llm, PROMPT_A, "t:a")
    assert out.num_cached_tokens == 0  # expired on the device, in L2 and on disk
    assert disk.stats().expirations >= held and disk.stats().loads == 0
    settle(llm)
    assert files_by_block(llm, tmp_path, PROMPT_A) == {}
    engine.kv.check_integrity()


def test_a_disk_file_past_its_ttl_is_a_miss_after_a_restart(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, retention_ttl_s=60.0)
    bury_a(llm)
    llm.engine.close()
    import time

    later = time.time() + 120.0  # the files were last used two minutes ago
    monkeypatch.setattr("engine.kv_cache.disk_tier.wall_time", lambda: later)
    restarted = with_l3(tiny_model, tmp_path, block_bytes, retention_ttl_s=60.0)
    assert run(restarted, PROMPT_A, "t:a").num_cached_tokens == 0
    settle(restarted)
    assert files_by_block(restarted, tmp_path, PROMPT_A) == {}


def test_one_tenant_cannot_flush_the_others_disk_share(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, host_blocks=4, disk_blocks=8)
    spill_a(llm)
    disk = disk_of(llm)
    assert disk.domain_blocks()["t:a"] >= 2
    for i in range(6):  # b floods: 60 blocks of its own through an 8-block tier
        run(llm, list(range(1000 + 100 * i, 1080 + 100 * i)), "t:b")
    settle(llm)
    blocks = disk.domain_blocks()
    assert blocks["t:a"] >= 8 // 2 and blocks["t:b"] >= 1
    assert disk.counters.evictions > 0 and len(block_files(tmp_path)) == len(disk) <= 8
    out = run(llm, PROMPT_A, "t:a")
    # a's chain: the device's floor block, its host share, then its disk share.
    assert out.num_cached_tokens == 56
    llm.engine.kv.check_integrity()


def test_a_full_disk_mid_serving_degrades_with_one_warning(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import errno

    from engine.kv_cache.disk_store import DiskStore

    llm = with_l3(tiny_model, tmp_path, block_bytes)
    reference = run(llm, PROMPT_A, "t:a")

    def full(self: DiskStore, key: bytes, header: bytes, payload: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskStore, "_write_file", full)
    with caplog.at_level(logging.WARNING, logger="engine"):
        run(llm, FLOOD_B, "t:b")
        settle(llm)
        out = run(llm, PROMPT_A, "t:a")
        run(llm, list(range(300, 380)), "t:c")
        settle(llm)
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids
    assert block_files(tmp_path) == []
    disk = disk_of(llm)
    assert disk.files.failed and disk.counters.refused > 0
    full_warnings = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert len(full_warnings) == 1
    llm.engine.kv.check_integrity()


def test_disk_settings_are_checked_at_start(
    tiny_model: pathlib.Path,
    tmp_path: pathlib.Path,
    block_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = {"num_blocks": 12, "block_size": BLOCK, "kv_host_bytes": block_bytes}
    with pytest.raises(ValueError, match="kv_disk_bytes"):
        LLMEngine.from_options(
            str(tiny_model), **base, kv_disk_path=str(tmp_path), kv_disk_bytes=-1
        )
    with pytest.raises(ValueError, match="kv_disk_path"):
        LLMEngine.from_options(
            str(tiny_model),
            num_blocks=12,
            block_size=BLOCK,
            kv_disk_path=str(tmp_path),
            kv_disk_bytes=1 << 20,
        )

    def started(name: str, **options: object) -> tuple[LLMEngine, list[str]]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="engine"):
            engine = LLMEngine.from_options(str(tiny_model), **base, **options)
        return engine, [r.getMessage() for r in caplog.records if name in r.getMessage()]

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for options, name in [
        ({"kv_disk_path": str(a_file), "kv_disk_bytes": 1 << 20}, "kv_disk_path"),
        ({"kv_disk_path": str(a_file / "below"), "kv_disk_bytes": 1 << 20}, "kv_disk_path"),
        ({"kv_disk_path": str(tmp_path / "zero"), "kv_disk_bytes": 0}, "kv_disk_path"),
        ({"kv_disk_path": str(tmp_path / "tiny"), "kv_disk_bytes": 100}, "kv_disk_bytes"),
    ]:
        engine, warned = started(name, **options)
        assert len(warned) == 1, (options, warned)
        tier = cast(HostTier, engine.kv.tier)
        assert tier is not None and tier.lower is None
        assert [t.medium for t in engine.stats().kv_tiers] == ["CPU_HOST"]

    # A directory the engine may not write (as root, chmod would not stop us).
    def unwritable(self: object, repeats: int = 3) -> list[tuple[int, float]]:
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:
        m.setattr("engine.kv_cache.disk_store.DiskStore.probe_read", unwritable)
        engine, warned = started(
            "kv_disk_path", kv_disk_path=str(tmp_path / "ro"), kv_disk_bytes=1 << 20
        )
    assert len(warned) == 1 and cast(HostTier, engine.kv.tier).lower is None

    # Larger than the free space: clamped, with one warning.
    class Usage:
        free = 40 * disk_file_bytes(block_bytes, BLOCK)

    monkeypatch.setattr("engine.kv_cache.host_setup.shutil.disk_usage", lambda _p: Usage)
    engine, warned = started(
        "kv_disk_bytes", kv_disk_path=str(tmp_path / "big"), kv_disk_bytes=1 << 50
    )
    assert len(warned) == 1
    disk = cast(HostTier, engine.kv.tier).lower
    assert disk is not None and disk.stats().capacity_blocks == 32
    engine.kv.check_integrity()


def test_integrity_covers_the_disk_tier(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    spill_a(llm)
    llm.engine.kv.check_integrity()
    disk = disk_of(llm)
    held = next(iter(disk._by_key.values())).slot
    disk._free.append(held)  # a budget unit held and free at once
    with pytest.raises(AssertionError):
        llm.engine.kv.check_integrity()


def test_the_cost_rule_recomputes_when_the_disk_is_slow(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    spill_a(llm)
    disk = disk_of(llm)
    assert disk.cost is not None
    disk.cost.host.observe_prefill(100, 1e-3)
    for _ in range(20):
        disk.cost.observe_read(1, 1.0)  # one byte a second: reading never pays
    out = run(llm, PROMPT_A, "t:a")
    held = disk.domain_blocks()["t:a"]
    # The device's floor block and the host tier's one block only; the disk's recomputed.
    assert out.num_cached_tokens <= 2 * BLOCK
    assert disk.stats().loads == 0 and disk.stats().recomputed_instead >= held
    assert len(files_by_block(llm, tmp_path, PROMPT_A)) == held  # kept for later
