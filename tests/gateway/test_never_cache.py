"""A never-cache tenant's requests reach the engine with cache=False, whatever they ask.

Over HTTP with the openai SDK, against the real engine over the fast fake model (which
keeps no cache for a cache=False request: see test_tenant_cache_policy_live.py for that),
its submits recorded (tests/utils/engine_faults.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.engine_faults import record
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

PROMPT = [{"role": "user", "content": "Tell me about isolated caches, please. " * 4}]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    gw, stop = start_gateway(tmp_path, engine=gateway_test_engine(), limiter=MemoryLimiter())
    yield gw
    stop()


def _cached(gw: LiveGateway, key: str, **extra: Any) -> int:
    out = gw.client(key).chat.completions.create(
        model=gw.model, messages=PROMPT, max_tokens=3, temperature=0, **extra
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return int(out.usage.prompt_tokens_details.cached_tokens or 0)


def test_never_cache_tenant_gets_no_hits_and_cache_true_cannot_override(
    gateway: LiveGateway,
) -> None:
    recorded = record(gateway.engine)  # each request's (domain, cache flag) as submitted
    shy = gateway.tenant("shy")
    normal = gateway.tenant("normal")
    with gateway.sessions() as s:
        store.update_tenant(s, name="shy", never_cache=True)
    for _ in range(2):
        assert _cached(gateway, shy) == 0
    assert _cached(gateway, shy, extra_body={"cache": True}) == 0
    assert _cached(gateway, normal) == 0
    assert _cached(gateway, normal) > 0  # the same prompt is a hit for a caching tenant
    flags = [request.cache for request in recorded.submitted]
    assert flags == [False, False, False, True, True]
    # Turning it off again takes effect on the next request (refresh_s 0 here).
    with gateway.sessions() as s:
        store.update_tenant(s, name="shy", never_cache=False)
    assert _cached(gateway, shy) == 0 and _cached(gateway, shy) > 0
