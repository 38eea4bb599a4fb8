"""Fairness and the waiting queue belong to the tenant, over HTTP with the openai SDK.

The gateway serves the real engine with `cloister serve`'s default engine options
(fair_lpm, 64 running, 256 waiting) over a fake fast model whose forward pass waits
for a gate: closed, the engine stops in its first step while the requests pile up,
so the backlog is exact; opened, the order in which the gateway settles the
requests (its usage records) is the order the engine finished them, which for
requests of the same length is the order it admitted them. (The client's own
order is not: it reads the answers slower than the fake engine makes them.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from sqlalchemy import select

from tenancy import store
from tenancy.models import Tenant
from tests.gateway.gated import gated_gateway
from tests.utils.fast_fake_model import GatedFakeModel
from tests.utils.live_gateway import LiveGateway
from tests.utils.principals import PEPPER

pytestmark = pytest.mark.slow

FLOOD = 300
MAX_TOKENS = 4


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[LiveGateway, GatedFakeModel]]:
    """A live gateway over the gated fake model, with the service's engine options."""
    # No ITL budget (gated_gateway's): with one, the order measured here would follow whose
    # prompt was cached first.
    with gated_gateway(tmp_path, max_model_len=256, num_blocks=4096) as started:
        yield started


def add_tenant(gw: LiveGateway, name: str, *, keys: int = 1, **tenant: Any) -> list[str]:
    """A tenant (isolation, weight) with `keys` keys; returns their secrets."""
    with gw.sessions() as s:
        store.create_tenant(s, name=name, **tenant)
    secrets = []
    for _ in range(keys):
        with gw.sessions() as s:
            secrets.append(store.create_key(s, tenant_name=name, pepper=PEPPER).secret)
    return secrets


def served_order(gw: LiveGateway) -> list[str]:
    """Tenant names of the answered requests, in the order the gateway settled them."""
    with gw.sessions() as s:
        names = {t.id: t.name for t in s.scalars(select(Tenant))}
    order = [names[r.tenant_id] for r in gw.usage.records if r.status == 200]
    return [name for name in order if name != "warm-up"]


async def ask(client: AsyncOpenAI) -> int:
    """One chat completion; its status (200, or 503 engine_overloaded)."""
    try:
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=MAX_TOKENS,
            temperature=0,  # the same answer, so the same work, for every request
        )
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc
        assert exc.code == "engine_overloaded", exc.body
        return 503
    return 200


def client(gw: LiveGateway, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0, timeout=120)


async def stall(gw: LiveGateway) -> asyncio.Task[int]:
    """Stops the engine inside a step that holds one request of a third tenant, so that
    everything sent next waits in its inbox; returns that request's task."""
    (key,) = add_tenant(gw, "warm-up")
    task = asyncio.create_task(ask(client(gw, key)))
    while not gw.engine.engine.scheduler.running:
        await asyncio.sleep(0.02)
    return task


def test_a_flood_cannot_starve_or_refuse_another_tenant(
    gated: tuple[LiveGateway, GatedFakeModel],
) -> None:
    """A floods 300 requests into a stopped engine; B's one request is still admitted
    (200, not 503), A's excess is what is refused, and B is admitted before A's backlog
    drains."""
    gw, model = gated
    (a_key,) = add_tenant(gw, "flooder")
    (b_key,) = add_tenant(gw, "bystander")
    engine = gw.engine

    async def scenario() -> tuple[list[int], int]:
        a, b = client(gw, a_key), client(gw, b_key)
        warm_up = await stall(gw)
        flood = [asyncio.create_task(ask(a)) for i in range(FLOOD)]
        # Every A request is queued in the stopped engine or already refused.
        while engine._num_sent + sum(1 for t in flood if t.done()) < FLOOD + 1:
            await asyncio.sleep(0.02)
        sent = engine._num_sent
        b_task = asyncio.create_task(ask(b))
        while engine._num_sent == sent and not b_task.done():
            await asyncio.sleep(0.02)
        model.gate.set()  # B's request is in the engine's inbox, behind A's whole flood
        b_status = await b_task
        statuses = await asyncio.gather(*flood)
        assert await warm_up == 200
        await a.close()
        await b.close()
        return statuses, b_status

    statuses, b_status = asyncio.run(scenario())
    done = served_order(gw)
    assert b_status == 200
    assert statuses.count(503) > 0  # A's excess is what is refused
    assert statuses.count(200) >= gw.engine.info.max_waiting // 2  # A kept its share
    # Admission order: B came back among the first waves, not behind A's backlog.
    assert done.index("bystander") < statuses.count(200) // 2, done.index("bystander")


# Requests per key of p, requests of q, and the window measured: two whole waves of 64
# (the engine's max_num_seqs; the answers of one wave are settled in any order).
@pytest.mark.parametrize(
    ("q_weight", "q_share", "per_key", "total_q", "window"),
    [(1.0, 0.5, 24, 120, 128), (2.0, 2 / 3, 26, 120, 128)],
)
def test_share_is_per_tenant_not_per_key(
    gated: tuple[LiveGateway, GatedFakeModel],
    q_weight: float,
    q_share: float,
    per_key: int,
    total_q: int,
    window: int,
) -> None:
    """Tenant p isolates per key and sends through 5 keys; tenant q through one. At equal
    weights each gets half of what is admitted; at weight 2, q gets two thirds."""
    gw, model = gated
    p_keys = add_tenant(gw, "per-key", keys=5, isolation_level="key")
    (q_key,) = add_tenant(gw, "single", weight=q_weight)
    engine = gw.engine

    async def scenario() -> None:
        clients = [client(gw, k) for k in p_keys] + [client(gw, q_key)]
        warm_up = await stall(gw)
        tasks = [asyncio.create_task(ask(c)) for _ in range(per_key) for c in clients[:5]]
        tasks += [asyncio.create_task(ask(clients[5])) for _ in range(total_q)]
        while engine._num_sent < len(tasks) + 1:
            await asyncio.sleep(0.02)
        model.gate.set()
        statuses = await asyncio.gather(*tasks)
        assert statuses.count(200) == len(tasks)
        assert await warm_up == 200
        for c in clients:
            await c.close()

    asyncio.run(scenario())
    # p's requests went in first, more of them than the window (250 at most in all: the
    # waiting queue holds them), so FCFS would give q about nothing of the window.
    first = served_order(gw)[:window]
    assert abs(first.count("single") / window - q_share) <= 0.06, first
    # Nothing is left behind per tenant or per key, on either side of the engine loop.
    assert engine._live == {}
    assert list(engine.engine.scheduler.tenants.keys) == []
