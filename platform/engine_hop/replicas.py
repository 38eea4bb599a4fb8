"""`replica_states`: each engine replica behind a served model, for the console and the
operators' /metrics.

A served model's client is in-process (one engine in this process), remote (one
engine server) or a replica set (several engine servers); the console shows one
row per engine either way. In-process engines also report their published-prefix
blocks (the public cache domain); remote ones do not send per-domain counters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine_hop.client import EngineClient, EngineSnapshot
from engine_hop.in_process import InProcessEngineClient
from engine_hop.remote_client import RemoteEngineClient
from engine_hop.replica_set import ReplicaSetClient

IN_PROCESS = "in-process"


@dataclass(frozen=True)
class ReplicaState:
    """One engine's load, pool shape and cache counters as last seen by the gateway."""

    replica: str  # IN_PROCESS, or the engine server's base URL
    alive: bool
    snapshot: EngineSnapshot  # num_blocks/block_size filled in where the engine told them
    in_process: bool
    # Blocks of published prefixes in this engine's KV cache now; None: not reported.
    public_cached_blocks: int | None = None
    # What an engine server says it runs on (None: in-process, where the registry
    # records it, or a server that does not say).
    device: str | None = None
    dtype: str | None = None
    # This gateway's requests streaming from it now; None: not counted (one engine).
    in_flight: int | None = None


def _in_process(client: InProcessEngineClient) -> ReplicaState:
    return ReplicaState(
        replica=IN_PROCESS,
        alive=client.alive,
        snapshot=client.stats(),
        in_process=True,
        public_cached_blocks=client.public_prefix_blocks(),
    )


def _remote(client: RemoteEngineClient, in_flight: int | None = None) -> ReplicaState:
    # The stats poll carries load only; the pool's shape came with /internal/info.
    snap = dataclasses.replace(
        client.stats(), num_blocks=client.info.num_blocks, block_size=client.info.block_size
    )
    info = client.info  # re-read by the client from each replica (remote_engine)
    return ReplicaState(
        client.base_url,
        client.alive,
        snap,
        in_process=False,
        device=info.device,
        dtype=info.dtype,
        in_flight=in_flight,
    )


def replica_states(client: EngineClient) -> list[ReplicaState]:
    """The engines behind `client`, one state each (a replica set's replicas in order)."""
    if isinstance(client, ReplicaSetClient):
        in_flight = client.in_flight()
        return [_remote(r, in_flight[r.base_url]) for r in client.replicas()]
    if isinstance(client, RemoteEngineClient):
        return [_remote(client)]
    if isinstance(client, InProcessEngineClient):
        return [_in_process(client)]
    return [ReplicaState(IN_PROCESS, client.alive, client.stats(), in_process=True)]
