"""KV events of the tiers below the device pool: each carries its tier's medium.

As vLLM's offloading connector does, a block written down to the host tier (L2) is
announced `BlockStored` with medium "CPU_HOST", one spilled to disk (L3) with
"DISK", and each is announced `BlockRemoved` with that medium when its tier drops
it; the device pool's own events keep the engine's medium ("CPU" here). The hashes
are the device's: a subscriber sees the same block move between media. Same engine
set-up as test_disk_tier.py (a host tier of one block, a disk tier under it).
"""

from __future__ import annotations

import pathlib
from typing import Any

from engine.kv_cache.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    encode_batch,
)
from engine.llm import LLM
from tests.engine.prefix_cache.disk_tier_setup import (
    BLOCK,
    PROMPT_A,
    bury_a,
    disk_of,
    host_of,
    run,
    settle,
    with_l3,
)


def events_of(llm: LLM) -> list[Any]:
    """The events logged since the last call, through the wire format and back."""
    log = llm.engine.kv.events
    assert log is not None
    batch = log.take()
    return [] if batch is None else list(decode_batch(encode_batch(batch)).events)


def stored_on(events: list[Any], medium: str) -> list[bytes]:
    return [h for e in events if isinstance(e, BlockStored) and e.medium == medium
            for h in e.block_hashes]  # fmt: skip


def removed_on(events: list[Any], medium: str) -> list[bytes]:
    return [h for e in events if isinstance(e, BlockRemoved) and e.medium == medium
            for h in e.block_hashes]  # fmt: skip


def test_blocks_written_down_and_dropped_are_announced_with_their_tier_s_medium(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes, retention_ttl_s=60.0)
    now = [1000.0]
    llm.engine.kv.clock = lambda: now[0]
    llm.engine.kv.record_events("CPU")
    assert events_of(llm) == [AllBlocksCleared()]
    run(llm, PROMPT_A, "t:a")
    first_events = events_of(llm)
    on_device = stored_on(first_events, "CPU")
    assert len(on_device) == 7  # a's 7 full blocks, one chain on the device
    run(llm, list(range(100, 180)), "t:a")
    run(llm, list(range(200, 280)), "t:a")
    settle(llm)
    bury_a_events = events_of(llm)
    # Each of a's blocks left the device, passed through the one host slot and went
    # on down to disk: announced on each medium with the device's own hash.
    assert set(on_device) <= set(removed_on(bury_a_events, "CPU"))
    assert set(on_device) <= set(stored_on(bury_a_events, "CPU_HOST"))
    assert set(on_device) <= set(removed_on(bury_a_events, "CPU_HOST"))
    assert set(on_device) <= set(stored_on(bury_a_events, "DISK"))
    assert not set(removed_on(bury_a_events, "DISK")) & set(on_device)
    tier_events = [e for e in bury_a_events if isinstance(e, BlockStored) and e.medium != "CPU"]
    for e in tier_events:
        assert len(e.block_hashes) == 1 and e.parent_block_hash is None
        assert len(e.token_ids) == BLOCK and e.cache_domain == "t:a"
    first = next(e for e in tier_events if e.block_hashes == [on_device[0]])
    assert first.token_ids == PROMPT_A[:BLOCK]
    # What each tier holds is what it announced and has not removed.
    seen = first_events + bury_a_events
    for tier in (host_of(llm), disk_of(llm)):
        held = set(stored_on(seen, tier.medium)) - set(removed_on(seen, tier.medium))
        assert held == set(tier._by_key)
    # The TTL drops them everywhere: removed on disk too.
    now[0] += 61.0
    assert run(llm, PROMPT_A, "t:a").num_cached_tokens == 0
    later = events_of(llm)
    assert set(on_device) <= set(removed_on(later, "DISK"))


def test_a_restarted_engine_announces_the_blocks_it_found_on_disk(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    llm = with_l3(tiny_model, tmp_path, block_bytes)
    llm.engine.kv.record_events("CPU")
    run(llm, PROMPT_A, "t:a")
    (chain,) = [e for e in events_of(llm) if isinstance(e, BlockStored)]
    bury_a(llm)
    llm.engine.close()
    restarted = with_l3(tiny_model, tmp_path, block_bytes)
    restarted.engine.kv.record_events("CPU")
    events = events_of(restarted)
    assert events[0] == AllBlocksCleared()
    assert set(chain.block_hashes) <= set(stored_on(events, "DISK"))
    assert stored_on(events, "CPU") == stored_on(events, "CPU_HOST") == []
    restarted.engine.close()
