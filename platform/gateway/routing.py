"""Which engine replica serves a request: tenant-aware, prefix-affine, with a load escape.

The route key is the request's cache root (its cache domain and adapter) and the
hashes of its prompt's first `affinity_blocks` full blocks. Weighted rendezvous
hashing ranks the replicas for that key, so one tenant's shared prefix, and the
later turns of a conversation (whose prompts start with the earlier ones), land on
the same replica, and other tenants' keys never depend on it. Replicas joining or
leaving move only the keys they win or lose.

Two escapes keep a viral prefix from overloading its replica: the request goes to
the best-ranked replica whose queue (waiting plus running requests) is within
`slack` of the shortest, so a hot prefix spills to its second-ranked replica, then
its third, only as the first ones fill (consistent hashing with bounded loads: the
power of two choices among the replicas that would hold the prefix, generalized).
And a replica that (re)joined ramps its rendezvous weight from `min_weight` to 1
over `ramp_s`, so a cold cache is not handed its full share at once.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from engine.kv_cache.cache_key import CacheKey, block_hash


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows of one replica when it routes."""

    replica_id: str
    queue_depth: int  # waiting + running requests
    kv_usage: float  # 0..1
    joined_at: float  # monotonic seconds when it (re)joined the set


@dataclass(frozen=True)
class RoutingConfig:
    """The policy's knobs."""

    block_size: int = 16
    affinity_blocks: int = 4
    slack: int = 4  # queue depth the first choice may exceed the second's by
    ramp_s: float = 30.0
    min_weight: float = 0.05


def route_key(
    cache_domain: str, adapter: str | None, prompt: Sequence[int], config: RoutingConfig
) -> bytes:
    """The bytes a request is routed by (the same for every gateway replica)."""
    parent = CacheKey.derive(cache_domain, adapter, "route").digest
    full = min(config.affinity_blocks, len(prompt) // config.block_size)
    for i in range(full):
        parent = block_hash(parent, prompt[i * config.block_size : (i + 1) * config.block_size])
    return parent


def ramp_weight(load: ReplicaLoad, now: float, config: RoutingConfig) -> float:
    """A replica's rendezvous weight: 1 when warm, growing linearly while it ramps."""
    if config.ramp_s <= 0:
        return 1.0
    age = max(0.0, now - load.joined_at)
    return max(config.min_weight, min(1.0, age / config.ramp_s))


def rank(key: bytes, loads: Sequence[ReplicaLoad], now: float, config: RoutingConfig) -> list[str]:
    """Replica ids, best first, by weighted rendezvous hashing of `key`."""

    def score(load: ReplicaLoad) -> float:
        digest = hashlib.blake2b(
            key + struct.pack(">Q", len(load.replica_id)) + load.replica_id.encode(),
            digest_size=8,
        ).digest()
        # A uniform in (0, 1); -w / ln(u) gives each replica a share proportional to w.
        u = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)
        return -ramp_weight(load, now, config) / math.log(u)

    return [load.replica_id for load in sorted(loads, key=score, reverse=True)]


def choose(
    key: bytes, loads: Sequence[ReplicaLoad], now: float, config: RoutingConfig
) -> list[str]:
    """Replica ids in the order to try: the chosen one first, then the fall-backs.

    The chosen one is the best-ranked replica whose queue is within `slack` of the
    shortest (consistent hashing with bounded loads): the key's own replica while it
    keeps up, the next-ranked ones as a hot prefix fills it.
    """
    order = rank(key, loads, now, config)
    depth = {load.replica_id: load.queue_depth for load in loads}
    bound = min(depth.values(), default=0) + config.slack
    for i, replica_id in enumerate(order):
        if depth[replica_id] <= bound:
            return [replica_id, *order[:i], *order[i + 1 :]]
    return order
