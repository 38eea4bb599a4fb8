"""A prefix being computed right now is computed once: a request of the same domain
that arrives with it waits for those blocks and adopts them from the cache; a request
of another domain never waits for it (that would be a timing channel). Every test
runs the fake model over the real scheduler and cache, and asserts the schedule."""

from __future__ import annotations

import pytest

from engine.scheduler.output import SchedulerOutput
from engine.sequence import Sequence
from tests.engine.prefix_cache.cache_driver import CacheDriver

SHARED = list(range(100, 132))  # 8 blocks of 4 tokens


def prompt(tail: int) -> list[int]:
    return SHARED + [tail, tail + 1, tail + 2]


def computed(out: SchedulerOutput, seq: Sequence) -> tuple[int, int] | None:
    """(start, end) of the tokens `seq` computes in the step, if it is in it."""
    for item in out.scheduled:
        if item.seq is seq:
            return item.start, item.end
    return None


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_a_same_domain_request_waits_and_adopts_the_prefix(mode: str) -> None:
    d = CacheDriver.make(mode, num_blocks=64)
    leader, follower = d.add(prompt(7), 3, "a"), d.add(prompt(9), 3, "a")
    first = d.step()
    assert computed(first, leader) == (0, 35)
    assert computed(first, follower) is None  # its prefix is in the leader's step
    second = d.step()
    assert computed(second, follower) == (32, 35)  # adopts all 8 shared blocks
    d.run()
    assert all(s.is_finished for s in (leader, follower))
    assert follower.num_cached_tokens == 32
    d.assert_clean()


def test_another_domain_never_waits() -> None:
    d = CacheDriver.make("hash", num_blocks=64)
    a, b = d.add(prompt(7), 3, "a"), d.add(prompt(9), 3, "b")
    first = d.step()
    assert computed(first, a) == (0, 35) and computed(first, b) == (0, 35)
    d.run()
    assert b.num_cached_tokens == 0
    d.assert_clean()


def test_with_chunked_prefill_the_follower_takes_each_block_once_it_is_cached() -> None:
    d = CacheDriver.make("hash", num_blocks=64, max_num_batched_tokens=12)
    leader, follower = d.add(prompt(7), 3, "a"), d.add(prompt(9), 3, "a")
    steps = [d.step() for _ in range(4)]
    assert [computed(s, leader) for s in steps[:3]] == [(0, 12), (12, 24), (24, 35)]
    # While the leader computes the shared blocks the follower waits; then it adopts
    # them all and computes only its own tail.
    assert [computed(s, follower) for s in steps[:3]] == [None, None, None]
    assert computed(steps[3], follower) == (32, 35)
    d.run()
    d.assert_clean()


def test_the_follower_goes_on_when_the_leader_ends_early() -> None:
    d = CacheDriver.make("hash", num_blocks=64, max_num_batched_tokens=12)
    leader, follower = d.add(prompt(7), 3, "a"), d.add(prompt(9), 3, "a")
    d.step()
    d.scheduler.finish(leader, "abort")
    out = d.step()
    # Blocks 0-2 were cached before the abort; the rest it computes itself.
    assert computed(out, follower) == (12, 24)
    d.run()
    d.assert_clean()


def test_without_the_cache_nothing_waits() -> None:
    d = CacheDriver.make("hash", num_blocks=64)
    a = d.add(prompt(7), 3, "a")
    b = d.add(prompt(9), 3, "a", use_cache=False)
    first = d.step()
    assert computed(first, a) == (0, 35) and computed(first, b) == (0, 35)
