"""The engines behind each served model, as GET /engines returns them."""

from __future__ import annotations

from pydantic import BaseModel


class SpeculativeDecoding(BaseModel):
    """An engine's speculative decoding since it started (engine.speculative.stats)."""

    num_drafts: int  # verify rows that carried at least one draft token
    num_draft_tokens: int  # draft tokens proposed
    num_accepted_tokens: int  # of those, accepted
    accepted_per_pos: list[int]  # accepted drafts by position in the draft (0: the first)
    acceptance_rate: float | None  # accepted / proposed; None before the first draft
    # Tokens one verify row emits on average (accepted drafts + the bonus token).
    mean_accepted_length: float | None


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


class EngineModel(BaseModel):
    """A served model and its engines."""

    model: str
    replicas: list[EngineReplica]


class EnginesView(BaseModel):
    """Every served model's engines; `connected` is False when this admin service runs
    apart from the gateway (no engines to read)."""

    connected: bool
    models: list[EngineModel]
