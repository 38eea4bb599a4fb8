"""A never-cache tenant's requests reach the engine with cache=False, whatever they ask.

Over HTTP with the openai SDK, against the fake engine (which here keeps no cache for a
cache=False request, like the real one: see test_tenant_cache_policy_live.py for that).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.outputs import StreamEvent
from engine.request import EngineRequest
from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.fakes import FakeEngine
from tests.utils.live_gateway import LiveGateway, start_gateway

PROMPT = [{"role": "user", "content": "Tell me about isolated caches, please. " * 4}]


class RecordingEngine(FakeEngine):
    """FakeEngine that records each request's cache flag and honours cache=False."""

    def __init__(self) -> None:
        super().__init__()
        self.cache_flags: list[tuple[str, bool]] = []

    def submit(self, request: EngineRequest) -> AsyncIterator[StreamEvent]:
        """Records (domain, cache); a cache=False request neither reads nor writes."""
        self.cache_flags.append((request.cache_domain, request.cache))
        if request.cache:
            return super().submit(request)
        seen = self._seen
        self._seen = {}  # nothing read, and what it would write is dropped below
        try:
            return super().submit(request)
        finally:
            self._seen = seen


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    gw, stop = start_gateway(tmp_path, engine=RecordingEngine(), limiter=MemoryLimiter())
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
    engine: RecordingEngine = gateway.engine
    shy = gateway.tenant("shy")
    normal = gateway.tenant("normal")
    with gateway.sessions() as s:
        store.update_tenant(s, name="shy", never_cache=True)
    for _ in range(2):
        assert _cached(gateway, shy) == 0
    assert _cached(gateway, shy, extra_body={"cache": True}) == 0
    assert _cached(gateway, normal) == 0
    assert _cached(gateway, normal) > 0  # the same prompt is a hit for a caching tenant
    flags = [flag for _, flag in engine.cache_flags]
    assert flags == [False, False, False, True, True]
    # Turning it off again takes effect on the next request (refresh_s 0 here).
    with gateway.sessions() as s:
        store.update_tenant(s, name="shy", never_cache=False)
    assert _cached(gateway, shy) == 0 and _cached(gateway, shy) > 0
