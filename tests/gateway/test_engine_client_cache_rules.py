"""`EngineClient.update_cache_rules`: the in-process client forwards the push as it is."""

from __future__ import annotations

import asyncio

from engine.kv_cache.cache_rules import CacheRules, DomainRule
from gateway.engine_client import EngineClient, InProcessEngineClient
from tests.gateway.fakes import FakeEngine


def test_in_process_client_forwards_cache_rules() -> None:
    fake = FakeEngine()
    client: EngineClient = InProcessEngineClient(fake)
    rules = CacheRules(domains=(("t:a", DomainRule(floor_blocks=4)),), published=((1, 2, 3),))
    assert fake.cache_rules is None
    asyncio.run(client.update_cache_rules(rules))
    assert fake.cache_rules is rules
    asyncio.run(client.update_cache_rules(CacheRules()))
    assert fake.cache_rules == CacheRules()
