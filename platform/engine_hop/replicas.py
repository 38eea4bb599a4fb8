"""`ReplicaState`: one engine replica behind a served model, for the console and the
operators' /metrics.

A served model's client is in-process (one engine in this process), remote (one
engine server) or a replica set (several engine servers); each says what engines it
stands for (`EngineClient.replica_states`), and the console shows one row per engine
either way. In-process engines also report their published-prefix blocks (the public
cache domain); remote ones do not send per-domain counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_hop.client import EngineSnapshot

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
