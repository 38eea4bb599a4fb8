"""A prefix in flight is computed once per tenant, over HTTP with the openai SDK.

Two requests of one tenant with the same long prompt reach a stopped engine together;
once it runs, one computes the prompt and the other waits for its blocks and reports
them as cached. A third tenant's request with the same prompt computes it itself: it
never waits on another tenant's work, and finds nothing of theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from tests.gateway.gated import gated_gateway
from tests.utils.fast_fake_model import GatedFakeModel
from tests.utils.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

PROMPT = "Summarise the quarterly report of the northern mills, section by section. " * 8


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[LiveGateway, GatedFakeModel]]:
    """A live gateway over the gated fake model, with the service's engine options."""
    with gated_gateway(tmp_path, max_model_len=512, num_blocks=1024) as started:
        yield started


async def _cached(client: AsyncOpenAI, content: str) -> tuple[int, int]:
    """(prompt tokens, cached prompt tokens) of one greedy chat completion."""
    done = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2,
        temperature=0,
    )  # fmt: skip
    assert done.usage is not None
    details = done.usage.prompt_tokens_details
    return done.usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


def test_one_tenant_computes_a_prefix_in_flight_once_and_others_never_wait(
    gated: tuple[LiveGateway, GatedFakeModel],
) -> None:
    gw, model = gated
    keys = {name: gw.tenant(name) for name in ("warm-up", "acme", "globex")}
    engine = gw.engine

    def client(name: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=gw.base_url + "/v1", api_key=keys[name], max_retries=0, timeout=120
        )

    async def scenario() -> list[tuple[int, int]]:
        # The engine stops inside a step holding the warm-up request; the rest queue.
        warm = asyncio.create_task(_cached(client("warm-up"), "hello"))
        while not engine.engine.scheduler.running:
            await asyncio.sleep(0.02)
        sent = engine._num_sent
        asks = [
            asyncio.create_task(_cached(client(name), PROMPT))
            for name in ("acme", "acme", "globex")
        ]
        while engine._num_sent < sent + 3:
            await asyncio.sleep(0.02)
        model.gate.set()
        await warm
        return list(await asyncio.gather(*asks))

    (p1, c1), (p2, c2), (p3, c3) = asyncio.run(scenario())
    assert p1 == p2 == p3 > 64
    # One of acme's two computed the prompt; the other adopted all its full blocks.
    assert sorted([c1, c2]) == [0, (p1 - 1) // 16 * 16]
    assert c3 == 0  # globex computed its own, beside acme's, and found nothing of it
