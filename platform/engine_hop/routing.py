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

That is the `prefix_affine` policy (the default). Two baselines sit beside it, as
the serving guide's section 12 compares them: `session` (a consistent hash of the
session: the cache root and the client's `user` hash, else the first block; a
conversation sticks, unrelated users of one system prompt need not meet) and
`round_robin` (no affinity: each replica in turn).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, get_args

from engine.kv_cache.cache_key import CacheKey, block_hash

PolicyName = Literal["prefix_affine", "session", "round_robin"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)


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


def session_hint(user: str | None) -> str | None:
    """The routing hint of a client's `user` field: its hash (the field itself never
    leaves the gateway), or None without one."""
    if not user:
        return None
    return hashlib.sha256(user.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class RouteRequest:
    """What a policy may look at in a request."""

    cache_domain: str
    adapter: str | None
    prompt: Sequence[int]
    session: str | None = None


class RoutePolicy(Protocol):
    """Orders the replicas for one request: the chosen one first, then the fall-backs."""

    @property
    def name(self) -> str:
        """The policy's setting value."""
        ...

    def order(self, request: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> list[str]:
        """Replica ids in the order to try."""
        ...


@dataclass(frozen=True)
class PrefixAffinePolicy:
    """Rendezvous hashing of the cache root and first blocks, with bounded loads."""

    config: RoutingConfig
    name: str = "prefix_affine"

    def order(self, request: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> list[str]:
        """See `choose`."""
        key = route_key(request.cache_domain, request.adapter, request.prompt, self.config)
        return choose(key, loads, now, self.config)


def session_key(request: RouteRequest, config: RoutingConfig) -> bytes:
    """The bytes a session is hashed by: the cache root and the `user` hash when there
    is one, else the cache root and the prompt's first block."""
    if request.session is None:
        first_block = replace(config, affinity_blocks=1)
        return route_key(request.cache_domain, request.adapter, request.prompt, first_block)
    parent = CacheKey.derive(request.cache_domain, request.adapter, "session").digest
    return hashlib.blake2b(parent + request.session.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class SessionPolicy:
    """Consistent hashing of the session, as a plain load balancer would: no load escape
    (the ramp still applies), so a session never leaves its replica while it serves."""

    config: RoutingConfig
    name: str = "session"

    def order(self, request: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> list[str]:
        """Replicas by rendezvous rank of the session key."""
        return rank(session_key(request, self.config), loads, now, self.config)


class RoundRobinPolicy:
    """Each replica in turn, whatever the request (no affinity, no load awareness)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, request: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> list[str]:
        """The next replica (by id order), then the others after it."""
        ids = sorted(load.replica_id for load in loads)
        if not ids:
            return []
        start = next(self._turn) % len(ids)
        return ids[start:] + ids[:start]


def make_policy(name: str, config: RoutingConfig) -> RoutePolicy:
    """The policy called `name` (one of `POLICY_NAMES`)."""
    if name == "prefix_affine":
        return PrefixAffinePolicy(config)
    if name == "session":
        return SessionPolicy(config)
    if name == "round_robin":
        return RoundRobinPolicy()
    raise ValueError(f"the router policy is one of {', '.join(POLICY_NAMES)}, not {name!r}")
