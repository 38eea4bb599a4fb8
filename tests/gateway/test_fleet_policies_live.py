"""The router policies over three `cloister engine serve` processes (tiny model).

The three engines start once; each policy gets its own in-thread gateway whose engine
client is a `ReplicaSetClient` over them (the "single" baseline: over the first alone).
Each gateway has its own database, so its tenants' cache domains are new to every
engine: no phase finds another's cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.fleet import (
    Workload,
    build_sessions,
    complete,
    engine_queries,
    hit_rate,
    max_mean,
    policy_gateway,
    run_hot,
    run_sessions,
)
from tests.gateway.engine_servers import EngineProcess, engine_servers
from tests.utils.live_gateway import LiveGateway
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow
# 8 sessions a round: round-robin moves each session one replica on per turn, as an
# uncorrelated balancer would (9, a multiple of 3, would keep them in place).
WORKLOAD = Workload(tenants=4, sessions=2, turns=3, concurrency=4, hot=24, hot_max_tokens=160)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def urls(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    engines: list[EngineProcess]
    with engine_servers(model_dir, tmp_path_factory.mktemp("engine-logs"), 3) as engines:
        yield [e.base_url for e in engines]


def _gateway(
    policy: str, urls: list[str], model_dir: Path, factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    with policy_gateway(urls, model_dir, factory.mktemp(policy), policy) as gw:
        yield gw


@pytest.fixture(scope="module")
def round_robin(
    urls: list[str], model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    yield from _gateway("round_robin", urls, model_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def prefix_affine(
    urls: list[str], model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    yield from _gateway("prefix_affine", urls, model_dir, tmp_path_factory)


def _workload_hit_rate(gw: LiveGateway, label: str) -> float:
    keys = [gw.tenant(f"{label}-{t}") for t in range(WORKLOAD.tenants)]
    served = run_sessions(gw.base_url, keys, build_sessions(WORKLOAD), WORKLOAD)
    assert len(served) == WORKLOAD.tenants * WORKLOAD.sessions * WORKLOAD.turns
    return hit_rate(served)


def test_prefix_affinity_keeps_a_single_replicas_hit_rate_and_round_robin_does_not(
    urls: list[str],
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    round_robin: LiveGateway,
    prefix_affine: LiveGateway,
) -> None:
    # A single replica: every request to the first engine.
    with policy_gateway(
        urls[:1], model_dir, tmp_path_factory.mktemp("single"), "round_robin"
    ) as gw:
        single = _workload_hit_rate(gw, "single")
    affine = _workload_hit_rate(prefix_affine, "affine")
    spread = _workload_hit_rate(round_robin, "spread")
    assert single > 0.5  # the workload reuses: system prefixes and session histories
    assert affine >= 0.9 * single, (single, affine, spread)
    # Round-robin finds the system prefix on most replicas but the history rarely.
    assert spread < 0.85 * single and spread < affine, (single, affine, spread)


def test_a_hot_prefix_spreads_over_the_replicas(
    urls: list[str], prefix_affine: LiveGateway
) -> None:
    prompt = build_sessions(Workload(tenants=1, sessions=1, turns=1, seed=7))[0].prompts[0]
    key = prefix_affine.tenant("viral")
    before = engine_queries(urls)
    served = run_hot(prefix_affine.base_url, key, prompt, WORKLOAD)
    after = engine_queries(urls)
    assert len(served) == WORKLOAD.hot
    ratio = max_mean(before, after)
    assert ratio < 1.5, (ratio, before, after)
    assert hit_rate(served) > 0.5  # the spilled requests still find the prefix


def _cached(gw: LiveGateway, key: str, prompt: tuple[int, ...]) -> int:
    with httpx.Client() as http:
        return complete(http, gw.base_url, key, prompt, user="u", max_tokens=2).cached_tokens


def test_no_tenant_finds_anothers_cache_on_any_replica(
    round_robin: LiveGateway, prefix_affine: LiveGateway
) -> None:
    prompt = build_sessions(Workload(tenants=1, sessions=1, turns=1, seed=11))[0].prompts[0]
    # Round-robin: A's prompt reaches every replica; B's, on each of them, finds nothing.
    a, b = round_robin.tenant("iso-a"), round_robin.tenant("iso-b")
    assert [_cached(round_robin, a, prompt) for _ in range(3)] == [0, 0, 0]
    assert [_cached(round_robin, b, prompt) for _ in range(3)] == [0, 0, 0]
    assert _cached(round_robin, a, prompt) > 0  # A's own cache is there
    # Prefix affinity: A's second request is a hit, B's first after it is not.
    a, b = prefix_affine.tenant("iso-a"), prefix_affine.tenant("iso-b")
    assert _cached(prefix_affine, a, prompt) == 0
    assert _cached(prefix_affine, a, prompt) > 0
    assert _cached(prefix_affine, b, prompt) == 0


def test_the_session_policy_keeps_each_users_conversation_on_its_replica(
    urls: list[str], model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # One system prefix, six users: each user's second turn finds its whole first turn
    # (the `user` hash routes it), and the users spread over more than one replica.
    system = build_sessions(Workload(tenants=1, sessions=1, turns=1, seed=13))[0].prompts[0]
    before = engine_queries(urls)
    with (
        policy_gateway(urls, model_dir, tmp_path_factory.mktemp("session"), "session") as gw,
        httpx.Client() as http,
    ):
        key = gw.tenant("sessions")
        for user in range(6):
            first = (*system, *range(2000 + 32 * user, 2032 + 32 * user))
            second = (*first, *range(3000, 3032))
            complete(http, gw.base_url, key, first, user=f"user-{user}", max_tokens=2)
            hit = complete(http, gw.base_url, key, second, user=f"user-{user}", max_tokens=2)
            assert hit.cached_tokens == len(first) // 16 * 16, (user, hit)
    used = [a > b for a, b in zip(engine_queries(urls), before, strict=True)]
    assert sum(used) >= 2, used  # all six on one replica: 1 in 243
