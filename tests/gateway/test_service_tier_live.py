"""`service_tier: "flex"` is batch work in the engine, over HTTP with the openai SDK.

The gateway serves the real engine (with `cloister serve`'s engine options) over the
fake model. A flex request runs as a batch sequence (admitted at once, as nothing
interactive waits), /metrics counts it as such while it runs, and it is answered and
metered like any request; an unknown tier is a 400 in OpenAI's error shape that
reaches no engine and bills nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.gateway.gated import gated_gateway
from tests.utils.fast_fake_model import GatedFakeModel
from tests.utils.live_gateway import OPERATOR_HEADERS, LiveGateway

pytestmark = pytest.mark.slow


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[LiveGateway, GatedFakeModel, str]]:
    """A live gateway over the gated fake model, and one tenant's key."""
    with gated_gateway(tmp_path, max_model_len=256, num_blocks=512) as (gw, model):
        yield gw, model, gw.tenant("acme")


def _gauge(gw: LiveGateway, name: str) -> float:
    text = httpx.get(gw.base_url + "/metrics", headers=OPERATOR_HEADERS, timeout=10).text
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")]
    assert values, (name, text[:2000])
    return float(values[0])


def test_a_flex_request_is_batch_work_and_is_answered(
    gated: tuple[LiveGateway, GatedFakeModel, str],
) -> None:
    gw, model, key = gated
    scheduler = gw.engine.engine.scheduler
    model.compute_s = 0.05  # 40 steps: about two seconds of running batch work
    model.gate.set()

    async def scenario() -> list[float]:
        client = AsyncOpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0)
        flex = asyncio.create_task(
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi there"}],
                max_tokens=40,
                temperature=0,
                extra_body={"ignore_eos": True},
                service_tier="flex",
            )  # fmt: skip
        )
        while not scheduler.running:
            await asyncio.sleep(0.02)
        assert [s.batch for s in scheduler.running] == [True]
        seen = []
        while not flex.done():  # the engine reports its counts after each step
            seen.append(await asyncio.to_thread(_gauge, gw, "cloister:num_batch_requests_running"))
        done = await flex
        await client.close()
        assert done.usage is not None and done.usage.completion_tokens == 40
        return seen

    assert 1.0 in asyncio.run(scenario())
    assert _gauge(gw, "cloister:num_batch_requests_running") == 0.0
    assert [r.status for r in gw.usage.records] == [200]  # metered like any request


@pytest.mark.parametrize("tier", ["bulk", "", "FLEX"])
def test_an_unknown_service_tier_is_a_clear_400(
    gated: tuple[LiveGateway, GatedFakeModel, str], tier: str
) -> None:
    gw, model, key = gated
    model.gate.set()
    client = OpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            service_tier=tier,  # type: ignore[arg-type]
        )  # fmt: skip
    body = refused.value.body
    assert isinstance(body, dict) and body.get("param") == "service_tier", body
    assert gw.engine.engine.scheduler.num_waiting == 0
    # Refused before the engine: its record carries the 400 and no tokens.
    assert [(r.status, r.prompt_tokens, r.completion_tokens) for r in gw.usage.records] == [
        (400, 0, 0)
    ]
