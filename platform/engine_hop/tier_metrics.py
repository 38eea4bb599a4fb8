"""The KV tiers' figures under vLLM's names, for both ends of the hop (issue 41).

The gateway's /metrics (gateway.metrics) and an engine server's own
(engine_server.metrics) export the KV connector's `vllm:external_prefix_cache_*` and the
offloading connector's `vllm:kv_offload_*` series from `tier_totals`, one function, so
the two never disagree on what a series counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.kv_cache.host_tier import TierStats


class TierFigures(Protocol):
    """What the totals read: an engine's stats (engine.stats.EngineStats) or the gateway's
    snapshot of them (engine_hop.client.EngineSnapshot)."""

    @property
    def kv_tiers(self) -> Sequence[TierStats]:
        """The tiers under the device pool, top-down (empty: none is on)."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per KV block (0: not known)."""
        ...

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache."""
        ...

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, tokens served from it (the tiers' loads included)."""
        ...


def tier_totals(stats: TierFigures) -> dict[str, float]:
    """The KV tiers' cumulative figures under vLLM's names (its KV connector's and its
    offloading connector's), from one snapshot; empty where no tier is on (no series, as
    vLLM without a connector).

    - external_prefix_cache_hits: prompt tokens loaded from a tier instead of computed
      (the tiers' loads, in blocks of the pool's block size);
    - external_prefix_cache_queries: prompt tokens the device pool did not hold, which
      the tiers were asked for: as vLLM counts them (request tokens minus local hits),
      the looked-up tokens less the device pool's own hits, the tokens the tiers gave
      counted as asked (the engine's prefix-cache hits include them);
    - kv_offload_load_bytes: bytes copied from a tier into the device pool;
    - kv_offload_store_bytes: bytes the device pool wrote down to the tier under it
      (the first of `kv_tiers`, which run top-down; a disk tier's writes come from the
      host tier, not from the device);
    - kv_offload_load_time / kv_offload_store_time: seconds those loads (a disk tier's
      file reads included) and those writes took, as vLLM's offloading connector counts
      its transfers' time.
    The token figures need the pool's block size; an engine that did not report it gets
    the byte figures only.
    """
    tiers = stats.kv_tiers
    if not tiers:
        return {}
    totals: dict[str, float] = {
        "kv_offload_load_bytes": sum(t.loads * t.bytes_per_block for t in tiers),
        "kv_offload_store_bytes": tiers[0].write_backs * tiers[0].bytes_per_block,
        "kv_offload_load_time": sum(t.load_time_s for t in tiers),
        "kv_offload_store_time": tiers[0].store_time_s,
    }
    if stats.block_size > 0:
        hits = sum(t.loads for t in tiers) * stats.block_size
        totals["external_prefix_cache_hits"] = hits
        # Looked-up tokens less the pool's own hits (its hits less the tiers' tokens).
        # Never below `hits` (queries >= hits always), and it only grows, as a counter
        # must: queries and hits grow together, by at least as much as the hits.
        totals["external_prefix_cache_queries"] = (
            stats.prefix_cache_queries - stats.prefix_cache_hits + hits
        )
    return totals


# vLLM's help texts for `tier_totals`' keys (each exported as the counter vllm:<key>), in
# the units its series use.
TIER_ALIASES = {
    "external_prefix_cache_queries": (
        "Prompt tokens looked up in the KV tiers below the device pool (vLLM's KV "
        "connector queries), in tokens."
    ),
    "external_prefix_cache_hits": (
        "Prompt tokens loaded from the KV tiers below the device pool (vLLM's KV "
        "connector hits), in tokens."
    ),
    "kv_offload_load_bytes": "Bytes of KV loaded from the tiers into the device pool.",
    "kv_offload_store_bytes": "Bytes of KV the device pool wrote down to the tier under it.",
    "kv_offload_load_time": "Total load time from the KV tiers into the device pool, in seconds.",
    "kv_offload_store_time": (
        "Total store time from the device pool to the tier under it, in seconds."
    ),
}
# vLLM's older labelled form of the two byte figures, which dashboards still read: the
# counter OFFLOAD_TOTAL_BYTES, label `transfer_type` by `tier_totals` key.
OFFLOAD_TOTAL_BYTES = "vllm:kv_offload_total_bytes"
OFFLOAD_TOTAL_BYTES_HELP = (
    "Bytes of KV moved between the device pool and the tiers under it, by direction "
    "(vLLM's older series)."
)
TRANSFER_TYPES = {"kv_offload_load_bytes": "CPU_to_GPU", "kv_offload_store_bytes": "GPU_to_CPU"}
