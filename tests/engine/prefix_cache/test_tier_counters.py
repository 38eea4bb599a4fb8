"""Each KV tier counts only what it served itself.

A block found in host memory is an L2 hit; a block the host tier lacks and the disk
tier finds is an L3 hit, and not an L2 one (the gateway exports each tier's counters
with its medium as the label, so a block counted in both would be served twice in
the figures). Same engine set-up as test_disk_tier.py: a host tier of one block, a
disk tier under it.
"""

from __future__ import annotations

import pathlib

from engine.kv_cache.tier_cost import LoadCostRule
from tests.engine.prefix_cache.disk_tier_setup import (
    BLOCK,
    PROMPT_A,
    disk_of,
    host_of,
    restarted_with_a_on_disk,
    run,
)


def test_a_block_served_from_disk_is_an_l3_hit_and_not_an_l2_hit(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    # A restarted engine: its pool and host tier are empty, so every hit is on disk.
    restarted = restarted_with_a_on_disk(tiny_model, tmp_path, block_bytes)
    host, disk = host_of(restarted), disk_of(restarted)
    out = run(restarted, PROMPT_A, "t:a")
    assert out.num_cached_tokens == 7 * BLOCK
    l2, l3 = restarted.engine.stats().kv_tiers
    assert (l2.medium, l3.medium) == ("CPU_HOST", "DISK")
    # The lookup went on into both tiers; only the disk found (and served) blocks.
    assert l2.lookups == 1 and l2.hits == 0 and l2.hit_blocks == 0 and l2.loads == 0
    assert l3.lookups == 1 and l3.hits == 1 and l3.hit_blocks == 7 and l3.loads == 7
    assert host.counters.recomputed_instead == disk.counters.recomputed_instead == 0
    restarted.engine.close()


def test_a_run_recomputed_instead_counts_in_the_tier_that_held_it(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, block_bytes: int
) -> None:
    restarted = restarted_with_a_on_disk(tiny_model, tmp_path, block_bytes)
    engine = restarted.engine
    slow = LoadCostRule(engine.capacity.bytes_per_block, BLOCK)
    slow.observe_copy(1, 1.0)  # one byte a second: loading never pays
    slow.observe_prefill(100, 1e-3)
    engine.kv.tier_cost = slow  # the host rule refuses the run the disk tier verified
    assert run(restarted, PROMPT_A, "t:a").num_cached_tokens == 0
    l2, l3 = engine.stats().kv_tiers
    assert l2.recomputed_instead == 0 and l2.hit_blocks == 0
    assert l3.recomputed_instead == 7 and l3.hit_blocks == 7 and l3.loads == 0
    engine.close()
