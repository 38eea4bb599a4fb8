"""One host tier's figures (engine.kv_cache.host_tier.TierStats) for the tests of what
shows them: /metrics on both ends, the dashboard, the admin engines view. Each test
varies it with `dataclasses.replace` where it needs other figures."""

from __future__ import annotations

from engine.kv_cache.host_tier import TierStats

HOST_TIER = TierStats(
    medium="CPU_HOST",
    capacity_blocks=100,
    blocks=10,
    bytes_per_block=4096,
    lookups=5,
    hits=3,
    hit_blocks=12,
    loads=9,
    write_backs=20,
    recomputed_instead=3,
    evictions=1,
    expirations=0,
)
