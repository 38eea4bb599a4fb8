"""The tenant, not the cache domain, is the unit of fairness: `fair_lpm` composes fair
order across tenants with longest prefix match within one, tenants with many cache
domains get one share, the waiting slots are shared by weight, and idle tenants
leave nothing behind in the scheduler's maps."""

from __future__ import annotations

import itertools

import pytest

from engine.errors import EngineOverloadedError
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.scheduler.fair import FairQueue
from engine.scheduler.tenants import TenantBook, within_share
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.engine_requests import make_request
from tests.utils.fast_fake_model import fast_fake_llm_engine
from tests.utils.queue_order import admission_order

SHARED = list(range(1, 17))  # four blocks of 4 tokens


def admissions(d: CacheDriver, max_steps: int = 5000) -> list[str]:
    """Runs `d` to the end; the fairness key of each sequence in admission order."""
    order: list[str] = []
    seen: set[str] = set()
    for _ in range(max_steps):
        if not d.scheduler.has_unfinished():
            return order
        d.step()
        for seq in d.scheduler.running:
            if seq.seq_id not in seen:
                seen.add(seq.seq_id)
                order.append(seq.fairness_key)
    raise AssertionError("did not finish")


def test_fair_lpm_is_fair_across_tenants_and_lpm_within_one() -> None:
    d = CacheDriver.make("hash", scheduling_policy="fair_lpm", max_num_seqs=1)
    d.add([*SHARED, 1], 1, "b")
    d.run()
    a = d.add([90, 91, 92, 93, 94], 1, "a")
    b_miss = d.add([80, 81, 82, 83, 84], 1, "b")
    b_hit = d.add([*SHARED, 2], 1, "b")
    # b's cache cannot move b ahead of a (equal counters: a's head is older).
    assert d.scheduler.waiting.peek() is a
    d.step()
    # a was charged its prompt; within b the longest match goes first, not the oldest.
    assert d.scheduler.waiting.peek() is b_hit
    d.step()
    assert d.scheduler.waiting.peek() is b_miss
    d.run()
    d.assert_clean()


@pytest.mark.parametrize("max_num_seqs", [1])
def test_order_across_tenants_ignores_another_tenants_cache(max_num_seqs: int) -> None:
    """PromptPeek: whether a's prefix is cached must not move b or c in the order.

    One sequence at a time, so that the order is the queue's choice alone. With more
    running at once, a's cached prefix makes a's own work shorter, which frees its slots
    sooner; that moves admissions whatever the scheduler (the tenant-blind one too, at
    4 or 6 sequences), and is compute a's hits save, not the queue reading the cache.
    The queue's own choice is checked at any depth in the test below.
    """

    def run(warm: bool) -> list[str]:
        d = CacheDriver.make(
            "hash",
            num_blocks=512,
            scheduling_policy="fair_lpm",
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=24,
        )
        # The same history for tenant a either way; only its cache differs (a cold run
        # caches the prefix under another domain of the same tenant, never matched).
        d.add([*SHARED, 1], 2, "a" if warm else "a/other", fairness_key="a")
        d.run()
        fresh = itertools.count(100)
        for i in range(6):
            d.add([*SHARED, 50 + i], 3, "a", fairness_key="a")
            d.add([next(fresh) for _ in range(18)], 3, "b", fairness_key="b")
            d.add([next(fresh) for _ in range(10)], 3, "c", fairness_key="c")
        return admissions(d)

    warm, cold = run(True), run(False)
    assert sorted(warm) == sorted(cold)
    assert warm == cold


def test_a_tenant_with_many_domains_gets_one_share() -> None:
    """Five keys of tenant p (five cache domains) against tenant q's one."""
    d = CacheDriver.make("off", num_blocks=4096, scheduling_policy="fair", max_num_seqs=1)
    fresh = itertools.count(1)
    for _ in range(20):
        for k in range(5):
            d.add([next(fresh) for _ in range(8)], 2, f"p/k{k}", fairness_key="p")
        d.add([next(fresh) for _ in range(8)], 2, "q", fairness_key="q")
    first = admissions(d)[:40]
    assert 17 <= first.count("q") <= 23  # half of 40, not a sixth


def test_weight_two_gets_twice_the_share() -> None:
    d = CacheDriver.make(
        "off",
        num_blocks=4096,
        scheduling_policy="fair_lpm",
        max_num_seqs=1,
        domain_weights=(("q", 2.0),),
    )
    fresh = itertools.count(1)
    for _ in range(40):
        d.add([next(fresh) for _ in range(8)], 2, "p/k1", fairness_key="p")
        d.add([next(fresh) for _ in range(8)], 2, "q", fairness_key="q")
    first = admissions(d)[:45]
    assert 27 <= first.count("q") <= 33  # two thirds of 45


def test_idle_tenants_are_pruned_from_every_map() -> None:
    d = CacheDriver.make("hash", scheduling_policy="fair_lpm", max_num_seqs=4)
    fresh = itertools.count(1)
    for t in range(50):
        for k in range(3):
            d.add([next(fresh) for _ in range(6)], 2, f"t{t}/k{k}", fairness_key=f"t{t}")
        d.scheduler.set_weight(f"t{t}", 1.0 + t)
    queue = d.scheduler.waiting
    assert isinstance(queue, FairQueue)
    assert len(list(d.scheduler.tenants.keys)) == 50
    d.run()
    assert list(d.scheduler.tenants.keys) == []
    assert d.scheduler.tenants.waiting == {}
    assert queue.counters == {}
    assert queue._queues == {}
    assert d.scheduler.tenants._weights == {}
    assert d.scheduler.tenants._fresh == {}
    # A running tenant keeps its counter; it goes only with its last sequence.
    s = d.add([1, 2, 3, 4, 5], 3, "x", fairness_key="x")
    d.step()
    assert s in d.scheduler.running and "x" in queue.counters
    d.run()
    assert queue.counters == {}


def test_make_room_refuses_a_key_at_its_share() -> None:
    book = TenantBook({"b": 2.0})
    assert within_share(0, 1, 1.0, 3.0, 3) and not within_share(1, 1, 1.0, 3.0, 3)
    assert book.make_room("a", 1, 1, 4) is None  # full, and nobody over a share to give
    assert book.weight("b") == 2.0 and book.weight("a") == 1.0


def test_full_queue_takes_the_flooders_newest_request() -> None:
    engine = fast_fake_llm_engine(max_waiting=8, max_model_len=64, num_blocks=64)
    params = SamplingParams(max_tokens=2)
    flood = [
        engine.add_request(make_request((1, 2, 3), params, request_id=f"a{i}", cache_domain="a/k"))
        for i in range(8)
    ]
    assert engine.scheduler.num_waiting == 8
    # a is over its share of a full queue: its own next request is refused.
    with pytest.raises(EngineOverloadedError):
        engine.add_request(make_request((1, 2), params, request_id="a8", cache_domain="a/k"))
    # b is under its share: a's newest request makes room for it.
    engine.add_request(
        make_request((4, 5), params, request_id="b0", cache_domain="b", fairness_key="b")
    )
    refused = engine.take_refused()
    assert [r for r, _ in refused] == [flood[-1]]
    assert isinstance(refused[0][1], EngineOverloadedError)
    assert "a7" not in engine.requests and "b0" in engine.requests
    assert engine.scheduler.num_waiting == 8
    assert engine.take_refused() == []
    while engine.has_unfinished():
        engine.step()
    assert engine.kv.usage == 0


def test_waiting_shares_follow_weights() -> None:
    engine = fast_fake_llm_engine(max_waiting=8, max_model_len=64, num_blocks=64)
    params = SamplingParams(max_tokens=1)
    for i in range(8):
        engine.add_request(make_request((1, 2), params, request_id=f"a{i}", fairness_key="a"))
    # b weighs 3 of 4: six of the eight slots, taken back one by one from a.
    for i in range(6):
        engine.add_request(
            make_request((3, 4), params, request_id=f"b{i}", fairness_key="b", weight=3.0)
        )
    with pytest.raises(EngineOverloadedError):
        engine.add_request(
            make_request((3, 4), params, request_id="b6", fairness_key="b", weight=3.0)
        )
    assert sorted(r for r, _ in engine.take_refused()) == [f"a{i}" for i in range(2, 8)]
    assert engine.scheduler.tenants.waiting == {"a": 2, "b": 6}
    # A third tenant at weight 1 is entitled to 8/5 slots: one, taken from b (most over).
    engine.add_request(make_request((5, 6), params, request_id="c0", fairness_key="c"))
    assert [r for r, _ in engine.take_refused()] == ["b5"]


def test_the_loop_reports_a_request_refused_to_make_room() -> None:
    from engine.fronts.core_loop import STOP, AddRequest, EngineLoop, StepReport

    engine = fast_fake_llm_engine(max_waiting=2, max_model_len=64, num_blocks=64)
    reports: list[StepReport] = []
    loop = EngineLoop(engine, reports.append)
    params = SamplingParams(max_tokens=2)
    for rid, key in (("a0", "a"), ("a1", "a"), ("b0", "b")):
        request = make_request(
            (1, 2, 3), params, request_id=rid, cache_domain=f"{key}/k", fairness_key=key
        )
        loop.put(AddRequest(request, 2))
    loop.put(STOP)
    loop.run()
    failures = [f for r in reports for f in r.failures]
    assert [f.request_id for f in failures] == ["a1"]
    assert isinstance(failures[0].error, EngineOverloadedError)
    assert set(engine.requests) == {"a0", "b0"}


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"fairness_key": 5}, "fairness_key"),
        ({"weight": 0.0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"weight": float("nan")}, "weight"),
        ({"weight": float("inf")}, "weight"),
        ({"weight": "2"}, "weight"),
    ],
)
def test_bad_fairness_inputs_are_refused_with_nothing_queued(
    options: dict[str, object], param: str
) -> None:
    from engine.errors import InvalidRequestError

    engine = fast_fake_llm_engine(max_model_len=64, num_blocks=64)
    with pytest.raises(InvalidRequestError) as caught:
        engine.add_request(
            EngineRequest(prompt_token_ids=(1, 2), params=SamplingParams(max_tokens=1), **options)  # type: ignore[arg-type]
        )
    assert caught.value.param == param
    assert not engine.requests and engine.scheduler.num_waiting == 0
    assert list(engine.scheduler.tenants.keys) == []


def test_the_queue_chooses_the_same_tenants_whatever_another_tenant_has_cached() -> None:
    """The fair queue's choice of tenant never reads the cache: with the same arrivals and
    service, the tenant of each pick is the same whether or not a's prefix is cached
    (within a, longest prefix match may pick another of a's own sequences)."""

    def picks(warm: bool) -> list[str]:
        d = CacheDriver.make("hash", num_blocks=512, scheduling_policy="fair_lpm")
        d.add([*SHARED, 1], 2, "a" if warm else "a/other", fairness_key="a")
        d.run()
        queue = FairQueue(book=TenantBook(), kv=d.kv)
        fresh = itertools.count(100)
        for i in range(6):
            for key, prompt in (
                ("a", [*SHARED, 50 + i]),
                ("b", [next(fresh) for _ in range(18)]),
                ("c", [next(fresh) for _ in range(10)]),
            ):
                seq = d.add(prompt, 3, key, fairness_key=key)
                d.scheduler.waiting.remove(seq)  # the driver's scheduler stays idle
                queue.push(seq)
        return [seq.fairness_key for seq in admission_order(queue)]

    assert picks(True) == picks(False)
