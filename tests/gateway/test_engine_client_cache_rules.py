"""`EngineClient.update_cache_rules`: the in-process client forwards the push as it is."""

from __future__ import annotations

import asyncio

from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine_hop.client import EngineClient
from engine_hop.in_process import InProcessEngineClient
from tests.utils.engine_faults import record_cache_rules
from tests.utils.fast_fake_model import gateway_test_engine


def test_in_process_client_forwards_cache_rules() -> None:
    engine = gateway_test_engine()
    pushed = record_cache_rules(engine)  # what reaches the real front
    client: EngineClient = InProcessEngineClient(engine)
    rules = CacheRules(domains=(("t:a", DomainRule(floor_blocks=4)),), published=((1, 2, 3),))
    assert pushed.cache_rules is None
    asyncio.run(client.update_cache_rules(rules))
    assert pushed.cache_rules is rules
    asyncio.run(client.update_cache_rules(CacheRules()))
    assert pushed.cache_rules == CacheRules()
