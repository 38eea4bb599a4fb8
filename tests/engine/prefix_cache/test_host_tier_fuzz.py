"""Random multi-tenant traffic through the real scheduler and cache with a host tier.

The fake store of `CacheDriver` gets a host side: the tier's ops run on it in order
before each step's fake forward, exactly where the engine runs them. Every adopted
block, loaded from the tier or not, must hold this sequence's tokens and have been
computed under its own domain (the driver's identity check), and the bookkeeping
must stay consistent after every step.
"""

from __future__ import annotations

import random

import pytest

from engine.kv_cache.eviction import CachePolicy
from engine.kv_cache.host_tier import HostTier, TierOp
from engine.scheduler.output import SchedulerOutput
from tests.engine.prefix_cache.cache_driver import CacheDriver, Identity


class TieredDriver:
    """A `CacheDriver` whose tier copies move fake blocks (tokens and identity)."""

    def __init__(self, driver: CacheDriver, tier: HostTier) -> None:
        self.d = driver
        self.tier = tier
        self.host: dict[int, tuple[list[int], Identity | None]] = {}
        self.loads = 0

    def run_ops(self) -> None:
        for op in self.tier.take_ops():
            self.run_host_op(op)

    def run_host_op(self, op: TierOp) -> None:
        """One host-tier op on the fake blocks: save (block -> slot), load (slot ->
        block) or scrub (the slot zeroed)."""
        if op.kind == "save":
            self.host[op.slot] = (list(self.d.store[op.block]), self.d.identity.get(op.block))
        elif op.kind == "load":
            tokens, ident = self.host[op.slot]
            self.d.store[op.block] = list(tokens)
            assert ident is not None
            self.d.identity[op.block] = ident
            self.loads += 1
        else:
            self.host[op.slot] = ([0] * self.d.kv.block_size, None)

    def step(self) -> SchedulerOutput:
        # The driver schedules and runs in one call: run the ops the lookups of this
        # step queued by wrapping its scheduler once.
        sched = self.d.scheduler
        original = sched.schedule

        def schedule_then_copy() -> SchedulerOutput:
            out = original()
            self.run_ops()
            return out

        sched.schedule = schedule_then_copy  # type: ignore[method-assign]
        try:
            return self.d.step()
        finally:
            sched.schedule = original  # type: ignore[method-assign]

    def run(self, max_steps: int = 20_000) -> None:
        for _ in range(max_steps):
            if not self.d.scheduler.has_unfinished():
                return
            self.step()
            self.d.kv.check_integrity()
        raise AssertionError("scheduler did not finish")


DOMAINS = ["t:a", "t:b", "t:c", "t:a/k:1"]


def shared_openings(rng: random.Random) -> list[list[int]]:
    """Four random prompt openings, for every domain: the same tokens under several
    domains must never be shared."""
    return [[rng.randrange(50) for _ in range(rng.randrange(4, 20))] for _ in range(4)]


def add_random_prompts(driver: CacheDriver, rng: random.Random, openings: list[list[int]]) -> None:
    """Queues a round of two to five requests, each an opening and a random tail, with
    random output lengths, under random DOMAINS."""
    for _ in range(rng.randrange(2, 6)):
        prompt = rng.choice(openings) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        driver.add(prompt, rng.randrange(1, 6), rng.choice(DOMAINS))


@pytest.mark.parametrize("mode", ["hash", "radix"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_with_a_host_tier_keeps_isolation(mode: str, seed: int) -> None:
    rng = random.Random(seed)
    policy = CachePolicy(fair_cached_share=0.2, scrub_freed_blocks=seed == 1)
    driver = CacheDriver.make(mode, num_blocks=24, block_size=4, policy=policy)
    driver.check_hits = False  # the driver's model knows the device pool only
    kv = driver.kv
    tier = HostTier(
        12 + 8 * seed, 1, ttl_of=kv.ledger.ttl, scrub_of=kv.ledger.scrub, medium="CPU_HOST"
    )
    kv.attach_tier(tier)
    tiered = TieredDriver(driver, tier)
    openings = shared_openings(rng)
    for _round in range(6):
        add_random_prompts(driver, rng, openings)
        tiered.run()
    driver.assert_clean()
    stats = tier.stats()
    assert stats.write_backs > 0 and stats.loads > 0
    assert tiered.loads == stats.loads
