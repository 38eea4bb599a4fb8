"""Fair in the running set: weighted KV shares pick the preemption victim and gate
admission, a lone tenant still uses the whole pool, and a tenant's KV quota is a hard
cap that holds no other tenant. Every test asserts the schedule and the block
accounting (never times), and runs the fake model over the real scheduler and cache,
so a wrong block would also show up as a wrong token."""

from __future__ import annotations

import pytest

from engine.errors import KVQuotaExceededError
from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.scheduler.prefill_shares import GRACE_STEPS
from engine.sequence import Sequence
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.fast_fake_model import fast_fake_llm_engine

POOL = 40  # blocks of 4 tokens


def make(kv_shares: bool = True, **sched: object) -> CacheDriver:
    return CacheDriver.make("hash", num_blocks=POOL, kv_shares=kv_shares, **sched)


def preemptions_by_key(d: CacheDriver, steps: int = 20_000) -> dict[str, int]:
    """Runs `d` to the end, checking integrity each step; preempted sequences per key."""
    seen: dict[str, int] = {}
    for _ in range(steps):
        if not d.scheduler.has_unfinished():
            return seen
        before = d.scheduler.num_preemptions
        running = {s.seq_id: s.fairness_key for s in d.scheduler.running}
        d.step()
        d.kv.check_integrity()
        if d.scheduler.num_preemptions > before:
            still = {s.seq_id for s in d.scheduler.running}
            for seq_id, key in running.items():
                seq = next(s for s in d.seqs if s.seq_id == seq_id)
                if seq_id not in still and not seq.is_finished:
                    seen[key] = seen.get(key, 0) + 1
    raise AssertionError("did not finish")


def fill_and_squeeze(d: CacheDriver) -> tuple[list[Sequence], list[Sequence]]:
    """Tenant a opens six long generations (96 blocks at their end, the pool is 40) and
    fills the pool; then tenant b arrives with two short ones."""
    attacker = [d.add([100 + i, 1, 2, 3], 60, "a", fairness_key="a") for i in range(6)]
    for _ in range(25):
        d.step()
    assert d.kv.pool.num_free <= 6, "the attacker did not fill the pool"
    victim = [d.add([200 + i, 5, 6, 7, 8, 9, 10, 11], 20, "b", fairness_key="b") for i in range(2)]
    return attacker, victim


def test_the_attacker_is_preempted_never_the_victim() -> None:
    d = make()
    attacker, victim = fill_and_squeeze(d)
    preempted = preemptions_by_key(d)
    assert preempted.get("b", 0) == 0
    assert preempted.get("a", 0) > 0
    stats = d.scheduler.kv_shares.stats(d.scheduler.running)
    assert stats["b"].preemptions_suffered == 0
    assert stats["a"].preemptions_suffered == d.scheduler.num_preemptions
    assert stats["b"].preemptions_caused > 0  # b's growth made the room
    assert all(s.finish_reason == "length" for s in [*attacker, *victim])
    d.assert_clean()


def test_the_tenant_blind_scheduler_preempts_the_victim() -> None:
    """The same attack with shares off: the newest sequence (b's) is preempted. This is
    what the test above guards against."""
    d = make(kv_shares=False)
    fill_and_squeeze(d)
    assert preemptions_by_key(d).get("b", 0) > 0
    d.assert_clean()


@pytest.mark.parametrize("kv_shares", [True, False])
def test_a_tenant_over_its_share_is_not_admitted_while_one_under_it_waits(
    kv_shares: bool,
) -> None:
    # First come, first served: without the gate b waits behind all of a's requests.
    d = make(kv_shares, scheduling_policy="fcfs", max_num_batched_tokens=64)
    for i in range(12):
        d.add([300 + i, *range(1, 12)], 8, "a", fairness_key="a")  # 5 blocks each at the end
    d.step()
    d.step()
    b = d.add([400, *range(1, 12)], 8, "b", fairness_key="b")
    order: list[str] = []
    seen = {s.seq_id for s in d.scheduler.running}
    while d.scheduler.has_unfinished():
        d.step()
        for s in d.scheduler.running:
            if s.seq_id not in seen:
                seen.add(s.seq_id)
                order.append(s.fairness_key)
    waiting_a = sum(1 for key in order if key == "a")
    assert waiting_a > 0
    if kv_shares:
        assert order[0] == "b"
    else:
        assert order.index("b") == waiting_a  # after every waiting sequence of a
    assert b.finish_reason == "length"
    d.assert_clean()


def test_a_lone_tenant_may_use_the_whole_pool() -> None:
    d = make()
    for i in range(6):
        d.add([500 + i, 1, 2, 3], 60, "a", fairness_key="a")
    peak = 0
    while d.scheduler.has_unfinished():
        d.step()
        peak = max(peak, d.scheduler.kv_shares.stats(d.scheduler.running)["a"].blocks_in_use)
    assert peak >= POOL - 2
    d.assert_clean()


def test_weights_set_the_shares() -> None:
    d = make()
    d.scheduler.set_weight("a", 3.0)
    d.add([1, 2, 3, 4], 4, "a", fairness_key="a")
    d.add([5, 6, 7, 8], 4, "b", fairness_key="b")
    shares = d.scheduler.kv_shares.shares()
    assert shares == pytest.approx({"a": POOL * 0.75, "b": POOL * 0.25})


def quota_driver(quota: int) -> CacheDriver:
    d = make()
    d.kv.apply_rules(CacheRules(domains=(("a", DomainRule(kv_quota_blocks=quota)),)))
    return d


def test_a_quota_caps_a_tenants_blocks_and_holds_nobody_else() -> None:
    d = quota_driver(10)
    for i in range(4):
        d.add([600 + i, 1, 2, 3], 24, "a", fairness_key="a")  # 7 blocks each at the end
    b = [d.add([700 + i, 1, 2, 3], 24, "b", fairness_key="b") for i in range(2)]
    b_started: int | None = None
    step = 0
    while d.scheduler.has_unfinished():
        d.step()
        step += 1
        stats = d.scheduler.kv_shares.stats(d.scheduler.running)
        assert stats["a"].blocks_in_use <= 10 if "a" in stats else True
        if b_started is None and any(s.fairness_key == "b" for s in d.scheduler.running):
            b_started = step
    assert b_started == 1  # b never waited for a's blocks
    assert all(s.finish_reason == "length" for s in d.seqs)
    assert all(s.num_preemptions == 0 for s in b)
    d.assert_clean()


def _tenant_request(prompt_len: int, params: SamplingParams, tenant: str) -> EngineRequest:
    """A request of `prompt_len` tokens (1, 2, ...) whose fairness key and cache domain
    are both `tenant`."""
    return EngineRequest(
        prompt_token_ids=tuple(range(1, prompt_len + 1)),
        params=params,
        fairness_key=tenant,
        cache_domain=tenant,
    )


def test_a_request_that_can_never_fit_its_quota_is_refused() -> None:
    engine = fast_fake_llm_engine(num_blocks=64, block_size=16)
    engine.kv.apply_rules(CacheRules(domains=(("t:a", DomainRule(kv_quota_blocks=2)),)))
    params = SamplingParams(max_tokens=20, temperature=0)
    with pytest.raises(KVQuotaExceededError, match="KV quota of 2 blocks") as caught:
        engine.add_request(_tenant_request(19, params, "t:a"))
    assert caught.value.param == "max_tokens"
    assert not engine.scheduler.has_unfinished()
    # 12 + 20 tokens fit 2 blocks of 16; another tenant is not bound by a's quota.
    engine.add_request(_tenant_request(12, params, "t:a"))
    engine.add_request(_tenant_request(39, params, "t:b"))
    assert engine.scheduler.num_waiting == 2


def test_the_victims_schedule_does_not_depend_on_which_tenant_was_preempted() -> None:
    """Timing hygiene: b's steps are the same whether a or c was the one squeezed, and
    wherever the squeezed tenant's sequences stand in the running list."""

    def b_schedule(
        heavy: str, light: str, *, heavy_first: bool, kv_shares: bool
    ) -> list[tuple[int, int]]:
        d = make(kv_shares)
        adds = [
            (heavy, [[800 + i, 1, 2, 3] for i in range(6)], 60),
            (light, [[900 + i, 1, 2, 3] for i in range(2)], 8),
        ]
        for key, prompts, max_tokens in adds if heavy_first else adds[::-1]:
            for prompt in prompts:
                d.add(prompt, max_tokens, key, fairness_key=key)
        for _ in range(25):
            d.step()
        d.add([1000, 5, 6, 7, 8, 9, 10, 11], 20, "b", fairness_key="b")
        out: list[tuple[int, int]] = []
        for step in range(5000):
            if not d.scheduler.has_unfinished():
                return out
            result = d.step()
            out += [(step, i.num_new_tokens) for i in result.scheduled if i.seq.fairness_key == "b"]
        raise AssertionError("did not finish")

    squeezed_a = b_schedule("a", "c", heavy_first=True, kv_shares=True)
    assert squeezed_a == b_schedule("c", "a", heavy_first=False, kv_shares=True)


@pytest.mark.parametrize("kv_shares", [True, False])
def test_a_long_running_prompt_leaves_room_for_another_tenants_first_chunk(
    kv_shares: bool,
) -> None:
    """A flood's long prompt in prefill must not hold a newcomer's first token for its
    whole length: the newcomer's first chunk goes alone (beside decodes), then the
    step's prompt tokens are split while both have work."""
    d = CacheDriver.make(
        "hash",
        num_blocks=400,
        kv_shares=kv_shares,
        max_num_batched_tokens=64,
        scheduling_policy="fair",
    )
    d.add(list(range(1, 401)), 1, "a", fairness_key="a")
    d.step()
    b = d.add([7, 8, 9, 10, 11, 12, 13, 14, 15, 16], 2, "b", fairness_key="b")
    first_b: int | None = None
    steps = 0
    a_tokens: list[int] = []
    while d.scheduler.has_unfinished():
        out = d.step()
        steps += 1
        a_tokens.append(sum(i.num_new_tokens for i in out.scheduled if i.seq.fairness_key == "a"))
        if first_b is None and any(i.seq is b for i in out.scheduled):
            first_b = steps
    if kv_shares:
        assert a_tokens[:2] == [0, 32]  # b's first chunk alone, then a's half of 64
    d.assert_clean()
    if kv_shares:
        assert first_b == 1
    else:
        assert first_b is not None and first_b >= 5  # behind a's whole prompt


def test_a_newcomer_within_its_share_is_admitted_in_a_step_that_preempts_the_attacker() -> None:
    """When the attacker's growth preempts its own sequences, the step still admits a
    tenant that stays within its share: it is not the next victim, and skipping it made
    the newcomer wait one more step each time the attacker hit the pool's end."""
    squeezed = 0
    for arrive_after in range(25, 45):
        d = make()
        for i in range(6):
            d.add([100 + i, 1, 2, 3], 60, "a", fairness_key="a")
        for _ in range(arrive_after):
            d.step()
        b = d.add([200, 5, 6, 7, 8, 9, 10, 11], 4, "b", fairness_key="b")
        while not b.admitted_once:
            out = d.step()
            if out.preempted:
                squeezed += 1
                assert any(i.seq is b for i in out.scheduled), arrive_after
        assert preemptions_by_key(d).get("b", 0) == 0
        d.assert_clean()
    assert squeezed >= 3  # b arrived before a step that preempted a's sequence


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_the_contended_cap_splits_admissions_too_and_a_tenant_keeps_its_part_for_a_grace(
    policy: str,
) -> None:
    """A flood of new long prompts (admissions, not running chunks) is split with a
    tenant that decodes like running chunks are; and for GRACE_STEPS steps after the newcomer's
    request ended, the flood still gets only its part (a client's next request arrives
    in that gap), then the whole cap again. Where b's request heads the queue (fair
    order), its first chunk goes alone."""
    d = CacheDriver.make(
        "hash", num_blocks=400, max_num_batched_tokens=64, scheduling_policy=policy
    )
    for i in range(10):
        d.add([600 + i, *range(1, 40)], 1, "a", fairness_key="a")  # 40-token prompts
    d.step()
    b = d.add([7, 8, 9, 10], 2, "b", fairness_key="b")
    a_tokens: list[int] = []
    while d.scheduler.has_unfinished():
        out = d.step()
        a_tokens.append(sum(i.num_new_tokens for i in out.scheduled if i.seq.fairness_key == "a"))
        if b.is_finished and len(a_tokens) > 3 + GRACE_STEPS:
            break
    assert b.is_finished
    assert a_tokens[0] == (0 if policy == "fair" else 32)  # a's waiting come first in fcfs
    assert a_tokens[1] == 32  # a's half of the step's 64 prompt tokens beside b's decode
    assert GRACE_STEPS >= 1
    assert a_tokens[2] == 32  # b's request ended the step before: its part is kept
    assert max(a_tokens[: 2 + GRACE_STEPS]) == 32  # through the whole grace
    assert a_tokens[2 + GRACE_STEPS] == 64  # then a is alone again
    while d.scheduler.has_unfinished():
        d.step()
    d.assert_clean()


def test_the_grace_ends_when_the_engine_goes_idle() -> None:
    """Grace is counted in steps, and an idle engine takes none: once every request has
    ended, the next tenant alone gets the whole cap at once, however long after."""
    d = CacheDriver.make("hash", num_blocks=400, max_num_batched_tokens=64)
    d.add([7, 8, 9, 10], 1, "b", fairness_key="b")
    d.step()
    assert not d.scheduler.has_unfinished()
    d.add(list(range(1, 101)), 1, "a", fairness_key="a")
    first = d.step()
    assert sum(i.num_new_tokens for i in first.scheduled) == 64
    while d.scheduler.has_unfinished():
        d.step()
    d.assert_clean()


def _tenants_in(out: object) -> list[str]:
    return sorted({i.seq.fairness_key for i in out.scheduled})  # type: ignore[attr-defined]


def test_a_newcomers_first_chunk_goes_without_the_decodes_of_tenants_served_more() -> None:
    """A step's cost grows with its rows, and a newcomer's first token waits for the whole
    step: the running sequences of tenants served more sit that step out, but never two
    steps running (a second newcomer right after the first does not hold them again)."""
    d = CacheDriver.make(
        "hash", num_blocks=400, max_num_batched_tokens=64, scheduling_policy="fair"
    )
    a = [d.add([300 + i, 1, 2, 3], 30, "a", fairness_key="a") for i in range(4)]
    for _ in range(5):
        d.step()
    b = d.add([7, 8, 9, 10, 11], 3, "b", fairness_key="b")
    first = d.step()
    assert [i.seq for i in first.scheduled] == [b]
    c = d.add([17, 18, 19, 20, 21], 3, "c", fairness_key="c")
    second = d.step()
    assert {i.seq.seq_id for i in second.scheduled} >= {s.seq_id for s in a}
    assert any(i.seq is c for i in second.scheduled)
    third = d.step()
    assert _tenants_in(third) == ["a", "b", "c"]
    while d.scheduler.has_unfinished():
        d.step()
    d.assert_clean()


def test_a_full_pool_holds_no_decodes_for_a_newcomer() -> None:
    """With no free block the newcomer's blocks come from a step in which the tenant over
    its share grows (and is preempted), so that tenant's decodes are not held."""
    d = make(scheduling_policy="fair")
    for i in range(6):
        d.add([100 + i, 1, 2, 3], 60, "a", fairness_key="a")
    for _ in range(100):
        if d.kv.pool.num_free == 0:
            break
        d.step()
    assert d.kv.pool.num_free == 0, "a did not fill the pool"
    d.add([200, 5, 6, 7, 8, 9, 10, 11], 4, "b", fairness_key="b")
    assert "a" in _tenants_in(d.step())
    assert preemptions_by_key(d).get("b", 0) == 0
    d.assert_clean()
