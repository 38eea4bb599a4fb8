"""The gateway's view of an engine: the `EngineClient` protocol, what a client reports
(`EngineSnapshot`) and those reports summed over replicas.

Its implementations: `in_process.InProcessEngineClient` (an engine front in this
process), `remote_client.RemoteEngineClient` (one engine server) and
`replica_set.ReplicaSetClient` (several), so nothing above knows where the engine runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.kv_cache.cache_rules import CacheRules
from engine.kv_cache.host_tier import TierStats
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.speculative.stats import SpecDecodeStats
from engine.stats import TenantKVStats
from engine.structured.spec import StructuredSpec
from engine_hop.adapters import AdapterInfo
from engine_hop.replicas import ReplicaState


class TokenizerLike(Protocol):
    """The part of the engine's tokenizer the gateway uses to count, template and check
    output constraints."""

    @property
    def eos_token_ids(self) -> Collection[int]:
        """The model's end-of-sequence token ids."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`."""
        ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The model's chat template rendered over `messages` (and `tools`, if it reads them)."""
        ...


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine counters the gateway exports; cumulative ones only ever grow."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_prompt_tokens: int = 0  # prompt tokens of requests whose prefill finished
    num_generation_tokens: int = 0  # tokens sampled
    num_blocks: int = 0  # the KV pool, in blocks of `block_size` tokens (0: not known)
    block_size: int = 0
    # LoRA: the engine's adapter slots (0: not known) and, when it reports them, the
    # adapters of its running and waiting requests (None: not reported).
    max_loras: int = 0
    running_adapters: tuple[str, ...] | None = None
    waiting_adapters: tuple[str, ...] | None = None
    # Prompt tokens the engine's next step may carry under its ITL budget (None: no budget).
    prefill_token_cap: int | None = None
    # KV-cache event batches dropped by the engine's publisher (None: it publishes none).
    kv_events_dropped: int | None = None
    # Per fairness key ("t:<tenant id>"): KV blocks in use, preemptions suffered and caused
    # (engine.stats.EngineStats.tenant_kv; empty where the engine reports none).
    tenant_kv: Mapping[str, TenantKVStats] = field(default_factory=dict)
    # Of num_running and num_waiting, the batch-class requests' sequences (service_tier
    # "flex"; engine.stats.EngineStats.num_batch_*).
    num_batch_running: int = 0
    num_batch_waiting: int = 0
    # The KV tiers under the device pool (engine.stats.EngineStats.kv_tiers; () where
    # none is on, or the engine does not report them).
    kv_tiers: tuple[TierStats, ...] = ()
    # Speculative decoding's cumulative drafts, draft tokens and accepted tokens
    # (engine.stats.EngineStats.spec_decode; None where it is off or not reported).
    spec_decode: SpecDecodeStats | None = None
    # Overlap scheduling's steps: launched while the one before ran, and run in turn
    # (engine.stats.EngineStats.num_overlapped_steps; 0 where it is off or not reported).
    num_overlapped_steps: int = 0
    num_synchronous_steps: int = 0


def sum_spec_decode(stats: Iterable[SpecDecodeStats | None]) -> SpecDecodeStats | None:
    """Several engines' speculation counters summed (position by position for the accepted
    tokens per draft position); None when none of them speculates."""
    present = [s for s in stats if s is not None]
    if not present:
        return None
    positions = max(len(s.accepted_per_pos) for s in present)
    return SpecDecodeStats(
        num_drafts=sum(s.num_drafts for s in present),
        num_draft_tokens=sum(s.num_draft_tokens for s in present),
        num_accepted_tokens=sum(s.num_accepted_tokens for s in present),
        accepted_per_pos=tuple(
            sum(s.accepted_per_pos[i] for s in present if i < len(s.accepted_per_pos))
            for i in range(positions)
        ),
    )


def sum_kv_tiers(tiers: Iterable[tuple[TierStats, ...]]) -> tuple[TierStats, ...]:
    """Several engines' KV tiers summed medium by medium, top-down in the order the
    media first appear (replicas of one model run the same tiers, so the same order)."""
    by_medium: dict[str, TierStats] = {}
    for stack in tiers:
        for t in stack:
            seen = by_medium.get(t.medium)
            by_medium[t.medium] = t if seen is None else _add_tiers(seen, t)
    return tuple(by_medium.values())


def _add_tiers(a: TierStats, b: TierStats) -> TierStats:
    """Two engines' figures of one medium, added (their block sizes agree: one model)."""
    return TierStats(
        medium=a.medium,
        capacity_blocks=a.capacity_blocks + b.capacity_blocks,
        blocks=a.blocks + b.blocks,
        bytes_per_block=max(a.bytes_per_block, b.bytes_per_block),
        lookups=a.lookups + b.lookups,
        hits=a.hits + b.hits,
        hit_blocks=a.hit_blocks + b.hit_blocks,
        loads=a.loads + b.loads,
        write_backs=a.write_backs + b.write_backs,
        recomputed_instead=a.recomputed_instead + b.recomputed_instead,
        evictions=a.evictions + b.evictions,
        expirations=a.expirations + b.expirations,
        load_time_s=a.load_time_s + b.load_time_s,
        store_time_s=a.store_time_s + b.store_time_s,
    )


def sum_tenant_kv(
    reports: Iterable[Mapping[str, TenantKVStats]],
) -> dict[str, TenantKVStats]:
    """Each key's blocks and preemptions summed over several engines' reports."""
    out: dict[str, TenantKVStats] = {}
    for report in reports:
        for key, s in report.items():
            before = out.get(key)
            out[key] = (
                s
                if before is None
                else TenantKVStats(
                    blocks_in_use=before.blocks_in_use + s.blocks_in_use,
                    preemptions_suffered=before.preemptions_suffered + s.preemptions_suffered,
                    preemptions_caused=before.preemptions_caused + s.preemptions_caused,
                )
            )
    return out


@runtime_checkable
class AdmittedLater(Protocol):
    """A stream whose engine admits or refuses its request after `submit` returned (an
    engine server's): `admitted` returns once the engine took the request, and raises
    what an in-process `submit` would have raised otherwise."""

    async def admitted(self) -> None:
        """Waits for the engine's admission; raises its refusal."""
        ...


class EngineClient(Protocol):
    """What the gateway needs from an engine.

    Contract: `submit` validates at once and raises `InvalidRequestError` or
    `EngineOverloadedError` with nothing queued (a remote engine, which decides after
    `submit` returned, gives a stream that is `AdmittedLater`, whose `admitted` raises
    them); otherwise the returned iterator
    yields `StreamEvent`s until one has `finished=True`. `abort` frees the request's
    KV blocks at once and is a no-op for unknown ids.
    """

    model_name: str
    max_model_len: int
    vocab_size: int

    @property
    def tokenizer(self) -> TokenizerLike:
        """The tokenizer of the served model."""
        ...

    def submit(self, request: EngineRequest) -> AsyncIterator[StreamEvent]:
        """Queues one request; raises at once when it cannot be queued.

        The request was validated when it was built (`EngineRequest`); the engine
        checks it once more against its own limits only. `cache=False` neither reads
        nor writes the prefix cache. Its `fairness_key` (the tenant) and `weight` are
        whose share of the engine's scheduler and waiting slots it uses; the cache
        domain is separate.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stops a request and frees its KV blocks."""
        ...

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Compiles an output constraint for requests of `cache_domain` before admission,
        off the event loop (compiled grammars are cached per domain, as KV is).

        Raises `StructuredSpecError` (a 400 naming the problem: an unsupported schema
        keyword, a size or compile-time limit) with nothing queued or charged.
        """
        ...

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Replaces the engine cache's per-domain rules and pushed published prefixes.

        Returns once the engine has them queued; it applies them before its next step.
        Raises `EngineDeadError` when the engine is dead.
        """
        ...

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Loads the PEFT adapter at `path` as `name` (idempotent for the same files)."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Unloads adapter `name`; raises `AdapterInUseError` while requests use it."""
        ...

    def adapters(self) -> list[AdapterInfo]:
        """The adapters loaded now (empty when none is)."""
        ...

    def stats(self) -> EngineSnapshot:
        """Current engine load and cumulative cache counters."""
        ...

    def replica_states(self) -> list[ReplicaState]:
        """The engines this client stands for, one state each (a replica set's in order)."""
        ...

    @property
    def alive(self) -> bool:
        """False once the engine cannot serve (its loop or process died, or it stopped)."""
        ...

    async def start(self) -> None:
        """Starts the engine (idempotent for clients that do not own it)."""
        ...

    async def shutdown(self) -> None:
        """Stops the engine."""
        ...
