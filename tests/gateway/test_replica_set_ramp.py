"""The replica set's ramp: the replicas it starts with are warm, later ones ramp up.

No engine server runs: the set is built on stub info (its clients make no I/O until
they start), and the clock the set reads is a test clock, so the route of each request
is a pure function of the keys and the time.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop import replica_set
from engine_hop.remote_client import EngineServerInfo
from engine_hop.replica_set import ReplicaSetClient
from engine_hop.routing import RoutingConfig
from tests.utils.byte_tokenizer import ByteTokenizer

INFO = EngineServerInfo("m", max_model_len=512, vocab_size=1000, num_blocks=64, block_size=4)
URLS = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
LATE = "http://127.0.0.1:11"  # nothing listens on these ports


class Clock:
    """Monotonic seconds that move only when told, plus `tick` at each reading (the time
    it takes to make each replica's client, which separated their join times)."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def make_set(monkeypatch: pytest.MonkeyPatch, clock: Clock, urls: list[str]) -> ReplicaSetClient:
    """A set over `urls` as they are when the set starts (and whatever they hold later)."""
    monkeypatch.setattr(replica_set, "first_info", lambda found, *_a, **_k: (found()[0], INFO))
    return ReplicaSetClient(
        URLS,
        token="svc",
        tokenizer=ByteTokenizer(),  # read for its end-of-sequence ids only: prompts are ids
        model_name="m",
        resolve=lambda _urls: list(urls),  # what `urls` holds at each re-resolution
        routing=RoutingConfig(block_size=4, affinity_blocks=2, ramp_s=30.0),
        clock=clock,
    )


def routes(clients: ReplicaSetClient, tenants: int) -> list[str]:
    """The chosen replica of one request per tenant (the same prompt for all)."""
    params = SamplingParams(max_tokens=1)
    chosen = []
    for t in range(tenants):
        request = EngineRequest(
            prompt_token_ids=(5, 6, 7, 8, 9, 10, 11, 12), params=params, cache_domain=f"tenant-{t}"
        )
        chosen.append(clients.route(request)[0].base_url)
    return chosen


def test_the_founding_replicas_keep_every_route_through_the_ramp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 30 ms between the two clients' creation: with a ramp from each one's own join
    # time, their weights' ratio drifts over the ramp and some tenants change replica
    # between two turns (the live test's rare miss of its own cache).
    clock = Clock(tick=0.03)
    clients = make_set(monkeypatch, clock, list(URLS))
    clock.tick = 0.0
    seen = []
    for elapsed in (2.0, 3.0, 5.0, 10.0, 20.0, 40.0):
        clock.now = 1000.0 + elapsed
        seen.append(routes(clients, 400))
    assert all(r == seen[0] for r in seen)
    assert set(seen[0]) == set(URLS)  # both serve some tenants


def test_a_replica_that_joins_later_ramps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(tick=0.0)
    found = list(URLS)
    clients = make_set(monkeypatch, clock, found)

    async def shares() -> list[int]:
        found.append(LATE)
        await clients.refresh_once()  # LATE is found (its poll fails: nobody listens)
        try:
            counts = [routes(clients, 600).count(LATE)]  # just joined
            clock.now += 15.0  # half the ramp
            counts.append(routes(clients, 600).count(LATE))
            clock.now += 30.0  # warm
            counts.append(routes(clients, 600).count(LATE))
        finally:
            await clients.shutdown()
        return counts

    just_joined, halfway, warm = asyncio.run(shares())
    # Weights 0.05, 0.5 and 1 against two warm replicas: shares of about 2.4 %, 20 %, 33 %.
    assert just_joined < 40 < halfway < 160 < warm
