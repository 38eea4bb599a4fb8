"""Tenant fairness: the virtual token counter keeps two backlogged tenants' weighted
service within the paper's bound, while FCFS lets the gap grow without bound."""

from __future__ import annotations

import itertools

import pytest

from engine.sampling_params import SamplingParams
from engine.scheduler.fair import FairQueue
from engine.sequence import Sequence
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.engine_requests import make_sequence

LONG, SHORT, MAX_TOKENS = 200, 10, 4
BUDGET = 64
IN_FLIGHT = 4  # each tenant keeps this many requests unfinished (a closed-loop client)
# Theorem 4.4 of Sheng et al.: |W_f - W_g| <= 2U, U = w_p * L_input + w_q * M
# (M: the most tokens one batch can hold); here w_p = 1, w_q = 2.
BOUND = 2 * (LONG + 2 * BUDGET)


def run(policy: str, steps: int, weights: tuple[tuple[str, float], ...] = ()) -> list[float]:
    d = CacheDriver.make(
        "off",
        num_blocks=4096,
        block_size=16,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=2,
        scheduling_policy=policy,
        domain_weights=weights,
    )
    weight = dict(weights)
    fresh = itertools.count(1)
    service = {"long": 0.0, "short": 0.0}
    gaps: list[float] = []
    outputs: dict[str, int] = {}
    for _ in range(steps):
        for domain, n in (("long", LONG), ("short", SHORT)):
            live = [s for s in d.seqs if s.cache_domain == domain and not s.is_finished]
            for _ in range(IN_FLIGHT - len(live)):
                d.add([next(fresh) for _ in range(n)], MAX_TOKENS, domain)
        admitted = {s.seq_id for s in d.seqs if s.admitted_once}
        d.step()
        for s in d.seqs:
            w = weight.get(s.cache_domain, 1.0)
            if s.admitted_once and s.seq_id not in admitted:
                service[s.cache_domain] += s.num_prompt_tokens / w
            new = s.num_output_tokens - outputs.get(s.seq_id, 0)
            service[s.cache_domain] += 2 * new / w
            outputs[s.seq_id] = s.num_output_tokens
        gaps.append(service["long"] - service["short"])
    return gaps


def test_fair_policy_bounds_the_service_gap() -> None:
    gaps = run("fair", 3000)
    assert max(abs(g) for g in gaps) <= BOUND
    assert abs(gaps[-1]) <= BOUND


def test_fcfs_gap_grows_without_bound() -> None:
    short_run, long_run = run("fcfs", 1000), run("fcfs", 3000)
    assert abs(long_run[-1]) > 5 * BOUND
    assert abs(long_run[-1]) > 2.5 * abs(short_run[-1])  # grows linearly with time


def test_weights_divide_service() -> None:
    # "long" weighs 3: it may take three times the raw service, and the gap in
    # weighted service still stays within the bound.
    gaps = run("fair", 3000, (("long", 3.0),))
    assert max(abs(g) for g in gaps) <= BOUND


def make_seq(domain: str, i: int) -> Sequence:
    return make_sequence(
        seq_id=f"{domain}{i}",
        request_id=f"{domain}{i}",
        index=0,
        prompt_token_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=1),
        max_tokens=1,
        cache_domain=domain,
    )


def test_returning_domain_is_lifted_to_the_lowest_active_counter() -> None:
    q = FairQueue()
    a0, b0 = make_seq("a", 0), make_seq("b", 0)
    q.push(a0)
    q.charge(a0, 100)
    q.push(make_seq("a", 1))
    q.pop(a0)
    q.push(b0)  # b was idle: it starts at a's counter, not at 0 with banked credit
    assert q.counters["b"] == pytest.approx(q.counters["a"]) == 100
    c = make_seq("c", 0)
    q.charge(c, 500)  # c served long ago; coming back it keeps its own higher counter
    q.push(c)
    assert q.counters["c"] == 500
    assert q.peek() is not c


def test_lpm_orders_only_within_the_head_domain() -> None:
    d = CacheDriver.make("hash", scheduling_policy="lpm", max_num_seqs=1)
    shared = list(range(1, 17))
    d.add([*shared, 1], 1, "b")
    d.run()
    # a arrives first with no cached prefix; b's later request has a long cached prefix.
    a = d.add([90, 91, 92, 93, 94], 1, "a")
    b_miss = d.add([80, 81, 82, 83, 84], 1, "b")
    b_hit = d.add([*shared, 2], 1, "b")
    first = d.scheduler.waiting.peek()
    assert first is a  # other domains' cache cannot move b ahead of a
    d.step()
    assert d.scheduler.waiting.peek() is b_hit  # within b, the longest match wins
    assert b_miss in list(d.scheduler.waiting)
    d.run()
