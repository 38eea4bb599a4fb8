"""The engines page's data: the gateway's replica states joined with the registry.

The gateway side (`engine_hop.replicas.replica_states`) reads the engine clients;
`mount_console` leaves a callable returning those states per model on the app, and
this module turns them into the API's schema. An in-process engine's device and dtype
come from the registry, which records what this process loaded (admin/served_models.py);
an engine server's from its own /internal/info.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from admin.models import RegisteredModel
from admin.schemas.engines import (
    EngineModel,
    EngineReplica,
    EnginesView,
    KVTier,
    SpeculativeDecoding,
)
from server.field_copy import copy_fields

if TYPE_CHECKING:  # the admin service also runs without a gateway in its process
    from engine.kv_cache.host_tier import TierStats
    from engine.speculative.stats import SpecDecodeStats
    from engine_hop.replicas import ReplicaState

EngineReplicas = Callable[[], Mapping[str, Sequence["ReplicaState"]]]


def _replica(state: ReplicaState, model: RegisteredModel | None) -> EngineReplica:
    s = state.snapshot
    local = model if state.in_process else None
    return EngineReplica(
        replica=state.replica,
        alive=state.alive,
        device=local.device if local else state.device,
        dtype=local.dtype if local else state.dtype,
        num_blocks=s.num_blocks,
        block_size=s.block_size,
        kv_capacity_tokens=s.num_blocks * s.block_size,
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        num_batch_running=s.num_batch_running,
        num_batch_waiting=s.num_batch_waiting,
        kv_cache_usage=s.kv_cache_usage,
        prefix_cache_queries=s.prefix_cache_queries,
        prefix_cache_hits=s.prefix_cache_hits,
        prefix_hit_rate=(
            s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else None
        ),
        public_cached_blocks=state.public_cached_blocks,
        speculative=_speculative(s.spec_decode),
        kv_tiers=[_tier(t) for t in s.kv_tiers],
    )


def _tier(t: TierStats) -> KVTier:
    """The page's figures of one KV tier under the device pool."""
    return copy_fields(KVTier, t, hit_rate=t.hits / t.lookups if t.lookups else None)


def _speculative(stats: SpecDecodeStats | None) -> SpeculativeDecoding | None:
    """The page's speculative decoding figures; None where the engine does not speculate."""
    if stats is None:
        return None
    return copy_fields(SpeculativeDecoding, stats, accepted_per_pos=list(stats.accepted_per_pos))


def engines_view(session: Session, replicas: EngineReplicas | None) -> EnginesView:
    """Each served model's engines, in the gateway's order; not connected without one."""
    if replicas is None:
        return EnginesView(connected=False, models=[])
    states = replicas()
    rows = session.scalars(select(RegisteredModel).where(RegisteredModel.name.in_(list(states))))
    registered = {m.name: m for m in rows}
    return EnginesView(
        connected=True,
        models=[
            EngineModel(
                model=name, replicas=[_replica(s, registered.get(name)) for s in model_states]
            )
            for name, model_states in states.items()
        ],
    )
