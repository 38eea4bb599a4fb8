"""The engines behind each served model, as GET /engines returns them."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SpeculativeDecoding(BaseModel):
    """An engine's speculative decoding since it started (engine.speculative.stats)."""

    num_drafts: int  # verify rows that carried at least one draft token
    num_draft_tokens: int  # draft tokens proposed
    num_accepted_tokens: int  # of those, accepted
    accepted_per_pos: list[int]  # accepted drafts by position in the draft (0: the first)
    acceptance_rate: float | None  # accepted / proposed; None before the first draft
    # Tokens one verify row emits on average (accepted drafts + the bonus token).
    mean_accepted_length: float | None


class KVTier(BaseModel):
    """One KV tier under an engine's device pool, since the engine started
    (engine.kv_cache.host_tier.TierStats, as the gateway's snapshot carries it)."""

    medium: str  # "CPU_HOST": host memory (L2); "DISK": local disk (L3)
    blocks: int  # blocks held now
    capacity_blocks: int
    bytes: int  # bytes held now
    capacity_bytes: int
    lookups: int  # lookups that went on into this tier after a device-pool miss
    hits: int  # of those, lookups that found at least one block here
    hit_rate: float | None  # hits / lookups; None before the first lookup
    hit_blocks: int  # blocks found here (loaded or recomputed)
    loads: int  # blocks loaded back into the device pool
    write_backs: int  # blocks written down to this tier
    recomputed_instead: int  # blocks found here but recomputed, that being cheaper
    evictions: int
    expirations: int


class EngineReplica(BaseModel):
    """One engine (in this process, or one engine server) and its state now."""

    replica: str  # "in-process", or the engine server's URL
    alive: bool
    device: str | None  # as the registry records it for an in-process engine; None: unknown
    dtype: str | None
    num_blocks: int  # the KV pool: blocks of `block_size` tokens (0: not reported)
    block_size: int
    kv_capacity_tokens: int  # num_blocks * block_size
    num_running: int
    num_waiting: int
    # Of num_running and num_waiting, the batch class's (Batch API lines, service_tier flex).
    num_batch_running: int = 0
    num_batch_waiting: int = 0
    kv_cache_usage: float  # 0..1
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int  # of those, tokens served from it
    prefix_hit_rate: float | None  # hits / queries; None before the first lookup
    # Blocks of published prefixes (the public cache domain) cached now; None: not reported.
    public_cached_blocks: int | None
    # Speculative decoding's figures; None: it is off (or the engine does not report it).
    speculative: SpeculativeDecoding | None = None
    # The KV tiers under the device pool, top-down; left out of the answer where no tier
    # is on (or the engine does not report them), as an engine without tiers answered.
    kv_tiers: list[KVTier] = Field(default_factory=list, exclude_if=lambda tiers: not tiers)


class EngineModel(BaseModel):
    """A served model and its engines."""

    model: str
    replicas: list[EngineReplica]


class EnginesView(BaseModel):
    """Every served model's engines; `connected` is False when this admin service runs
    apart from the gateway (no engines to read)."""

    connected: bool
    models: list[EngineModel]
