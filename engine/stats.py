"""A snapshot of the engine's counters, for metrics and the admin console."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_cache.counters import DomainCacheStats
from engine.kv_cache.host_tier import TierStats
from engine.speculative.stats import SpecDecodeStats


@dataclass(frozen=True)
class TenantKVStats:
    """One fairness key's (tenant's) use of the KV pool and the preemptions it met."""

    blocks_in_use: int  # blocks held by its running sequences now (a gauge)
    preemptions_suffered: int  # its sequences preempted (monotonic)
    preemptions_caused: int  # others' sequences preempted to make room for its own


@dataclass(frozen=True)
class EngineStats:
    """Gauges and monotonic counters; counters only grow over the engine's life."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens served from it
    num_preemptions: int
    num_blocks: int
    block_size: int
    num_requests_finished: int = 0
    num_generated_tokens: int = 0
    # Prompt tokens (cached ones too) of requests whose prefill finished, as vLLM counts them.
    num_prompt_tokens: int = 0
    # Per cache domain: lookups, hits, cached tokens, evictions (the public domain is "<public>").
    prefix_cache_domains: dict[str, DomainCacheStats] = field(default_factory=dict)
    # LoRA (vLLM's vllm:lora_requests_info): device slots, sequences per adapter name.
    max_loras: int = 0
    lora_running: dict[str, int] = field(default_factory=dict)
    lora_waiting: dict[str, int] = field(default_factory=dict)
    lora_device: tuple[str, ...] = ()  # adapters in a device slot now
    lora_host: tuple[str, ...] = ()  # adapters whose weights are in host memory
    # Prompt tokens the next step may carry under the ITL budget (None: no budget set).
    prefill_token_cap: int | None = None
    # KV-cache event batches the publisher's queue was too full to take (None: the
    # engine publishes none); a subscriber's index misses what they held.
    kv_events_dropped: int | None = None
    # Per fairness key (the tenant, "t:<tenant id>" from the gateway): KV blocks in use and
    # preemptions suffered and caused; keys with no live work and no preemption are left out.
    tenant_kv: dict[str, TenantKVStats] = field(default_factory=dict)
    # Of num_running and num_waiting, the batch-class sequences (EngineRequest.traffic_class).
    num_batch_running: int = 0
    num_batch_waiting: int = 0
    # The KV tiers under the device pool (the host tier, L2), each with its blocks, bytes,
    # hits, loads, write-backs and hits recomputed instead of loaded; () where none is on.
    kv_tiers: tuple[TierStats, ...] = ()
    # Speculative decoding's drafts, draft tokens and accepted tokens (None: it is off).
    spec_decode: SpecDecodeStats | None = None
    # Overlap scheduling (engine/overlap.py): steps launched while the one before ran, and
    # steps run in turn because a row needed the previous token first (both 0: it is off).
    num_overlapped_steps: int = 0
    num_synchronous_steps: int = 0
