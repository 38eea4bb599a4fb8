"""The engine series both ends of the hop export, by the stats field each one reads.

The gateway's /metrics (gateway.metrics, from `EngineSnapshot`) and an engine server's
own (engine_server.metrics, from `engine.stats.EngineStats`, the same field names) name
and describe them from these tables, so a dashboard reads either end alike. Model-level
tables map a field to (series, help); a field that is None (an engine that does not
report the figure) leaves its series out.
"""

from __future__ import annotations

# Figures of the moment, exported as gauges.
ENGINE_GAUGES = {
    "num_running": ("vllm:num_requests_running", "Requests running."),
    "num_waiting": ("vllm:num_requests_waiting", "Requests waiting."),
    "num_batch_running": (
        "cloister:num_batch_requests_running",
        "Of the running requests, batch-class ones (service_tier flex).",
    ),
    "num_batch_waiting": (
        "cloister:num_batch_requests_waiting",
        "Of the waiting requests, batch-class ones (service_tier flex).",
    ),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "KV cache usage (0..1)."),
}

# The prefix cache's cumulative figures, summed over every tenant (the gateway shows
# them to operators only: a prober could watch others' cache traffic in them).
PREFIX_CACHE_COUNTERS = {
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache.",
    ),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
}

# The engine's other cumulative figures, exported as counters.
ENGINE_COUNTERS = {
    "num_preemptions": ("vllm:num_preemptions", "Requests preempted by the engine."),
    "kv_events_dropped": (
        "cloister_kv_events_dropped",
        "KV-cache event batches dropped because the publisher's queue was full.",
    ),
}

# Speculative decoding's counters (engine.speculative.stats.SpecDecodeStats fields), under
# vLLM's names (vllm:spec_decode_<field>_total), so its dashboards' acceptance panels work.
SPEC_DECODE_COUNTERS = {
    "num_drafts": "Verify rows that carried at least one draft token.",
    "num_draft_tokens": "Draft tokens proposed and scored.",
    "num_accepted_tokens": "Draft tokens accepted.",
}

# The gauges of each KV tier under the device pool (engine.kv_cache.host_tier.TierStats
# fields), exported as cloister:kv_tier_<field>.
TIER_GAUGES = {
    "blocks": "KV blocks held in a tier below the device pool.",
    "bytes": "Bytes of KV held in a tier below the device pool.",
    "capacity_bytes": "Bytes of a KV tier below the device pool.",
}

# The counters of each KV tier (TierStats fields), exported as
# cloister:kv_tier_<field>_total.
TIER_COUNTERS = {
    "lookups": "Lookups that went on into a KV tier after a device-pool miss.",
    "hits": "Of those, lookups that found at least one block in the tier.",
    "hit_blocks": "KV blocks found in a tier (loaded or recomputed).",
    "loads": "KV blocks loaded back from a tier into the device pool.",
    "write_backs": (
        "KV blocks written down to a tier when the tier above it evicted them (the device "
        "pool, or for the disk the host tier)."
    ),
    "recomputed_instead": "KV blocks found in a tier but recomputed, being cheaper to.",
    "evictions": "KV blocks a tier dropped to make room.",
    "expirations": "KV blocks a tier dropped at their cache domain's retention TTL.",
}
