"""CacheRulesSync: tenant cache policies and published prefixes reach the engine client.

Against the real engine front over the fast fake model, its `update_cache_rules`
recorded (tests/utils/engine_faults.py: the last push in `.cache_rules`), behind the
real InProcessEngineClient, on a migrated SQLite database.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from assembly.cache_rules_sync import CacheRulesSync
from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine_hop.in_process import InProcessEngineClient
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.engine_faults import CacheRulesLog, record_cache_rules
from tests.utils.fast_fake_model import gateway_test_engine

MODEL = "fake-model"


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'sync.db'}"
    upgrade_database(url)
    factory = make_session_factory(make_engine(url))
    with factory() as s:
        registry.register_model(
            s, name=MODEL, source="/nowhere", format="safetensors", context_length=512
        )
        registry.register_model(
            s, name="other", source="/nowhere", format="safetensors", context_length=512
        )
    return factory


def _sync(sessions: sessionmaker[Session]) -> tuple[CacheRulesLog, CacheRulesSync]:
    engine = gateway_test_engine()
    return record_cache_rules(engine), CacheRulesSync(
        InProcessEngineClient(engine, model_name=MODEL), sessions, interval_s=0.05
    )


def test_first_push_then_only_changes(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        a = store.create_tenant(s, name="a").id
        b = store.create_tenant(s, name="b").id
        store.create_tenant(s, name="plain")  # all defaults: no rule at all
        store.update_tenant(s, name="b", cache_floor_share=0.25, scrub_on_free=True)
        store.update_tenant(s, name="a", cache_floor_blocks=8, retention_ttl_s=30.0)
    pushed, sync = _sync(sessions)

    async def scenario() -> None:
        assert await sync.sync_once() is True
        assert pushed.cache_rules == CacheRules(
            domains=tuple(
                sorted(
                    [
                        (f"t:{a}", DomainRule(floor_blocks=8, retention_ttl_s=30.0)),
                        (f"t:{b}", DomainRule(floor_share=0.25, scrub_freed_blocks=True)),
                    ]
                )
            ),
            published=(),
        )
        pushed.cache_rules = None
        assert await sync.sync_once() is False  # nothing changed: no push
        assert pushed.cache_rules is None

    asyncio.run(scenario())


def test_published_prefixes_of_the_served_model_only(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        registry.publish_prefix(s, name="z-ids", model=MODEL, token_ids=[5, 6, 7])
        registry.publish_prefix(s, name="a-text", model=MODEL, text="hello")
        registry.publish_prefix(s, name="elsewhere", model="other", token_ids=[1, 2])
    pushed, sync = _sync(sessions)
    tokenizer = pushed.engine.tokenizer

    async def scenario() -> None:
        await sync.sync_once()
        assert pushed.cache_rules is not None
        # By name; text tokenized without special tokens; the other model's left out.
        assert pushed.cache_rules.published == (
            tuple(tokenizer.encode("hello", add_special_tokens=False)),
            (5, 6, 7),
        )
        with sessions() as s:
            registry.withdraw_prefix(s, name="a-text")
        assert await sync.sync_once() is True
        assert pushed.cache_rules.published == ((5, 6, 7),)

    asyncio.run(scenario())


def test_background_loop_follows_a_change(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        tid = store.create_tenant(s, name="a").id
    pushed, sync = _sync(sessions)

    async def scenario() -> None:
        await sync.start()
        try:
            assert pushed.cache_rules == CacheRules()  # pushed once at start, even if empty
            with sessions() as s:
                store.update_tenant(s, name="a", cache_floor_blocks=3)
            for _ in range(100):
                if pushed.cache_rules and pushed.cache_rules.domains:
                    break
                await asyncio.sleep(0.02)
            assert pushed.cache_rules.domains == ((f"t:{tid}", DomainRule(floor_blocks=3)),)
        finally:
            await sync.stop()

    asyncio.run(scenario())


def test_database_error_keeps_last_rules_and_retries(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    with sessions() as s:
        tid = store.create_tenant(s, name="a").id
        store.update_tenant(s, name="a", cache_floor_blocks=4)
    broken = {"on": False}

    def flaky() -> Any:
        if broken["on"]:
            raise OperationalError("SELECT", {}, Exception("database is down"))
        return sessions()

    engine = gateway_test_engine()
    pushed = record_cache_rules(engine)
    sync = CacheRulesSync(InProcessEngineClient(engine, model_name=MODEL), flaky, interval_s=0.05)
    expected = CacheRules(domains=((f"t:{tid}", DomainRule(floor_blocks=4)),))

    async def scenario() -> None:
        assert await sync.sync_once() is True
        broken["on"] = True
        with caplog.at_level(logging.ERROR, logger="cloister.cache_rules"):
            assert await sync.sync_once() is False
        assert "last rules stay in force" in caplog.text
        assert pushed.cache_rules == expected and sync.last_pushed == expected
        broken["on"] = False
        with sessions() as s:
            store.update_tenant(s, name="a", cache_floor_blocks=None)
        assert await sync.sync_once() is True
        assert pushed.cache_rules == CacheRules()

    asyncio.run(scenario())


def test_engine_failure_is_retried(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        store.create_tenant(s, name="a")
        store.update_tenant(s, name="a", never_cache=True, cache_floor_share=0.5)
    engine = gateway_test_engine()
    pushed = record_cache_rules(engine, lambda n: RuntimeError("engine busy") if n == 1 else None)
    calls = pushed.calls
    sync = CacheRulesSync(InProcessEngineClient(engine, model_name=MODEL), sessions, interval_s=1)

    async def scenario() -> None:
        assert await sync.sync_once() is False and sync.last_pushed is None
        assert await sync.sync_once() is True  # the same rules, pushed again
        assert pushed.cache_rules == calls[0] and len(calls) == 2

    asyncio.run(scenario())


def test_kv_quota_reaches_the_engine_rule(sessions: sessionmaker[Session]) -> None:
    """A tenant's KV quota alone is a rule (the engine's scheduler reads it by root);
    cleared, the rule goes."""
    with sessions() as s:
        tid = store.create_tenant(s, name="capped").id
        store.update_tenant(s, name="capped", kv_quota_blocks=6)
        store.create_tenant(s, name="both")
        both = store.update_tenant(s, name="both", kv_quota_blocks=9, cache_floor_blocks=2).id
    pushed, sync = _sync(sessions)

    async def scenario() -> None:
        assert await sync.sync_once() is True
        assert pushed.cache_rules is not None
        assert dict(pushed.cache_rules.domains) == {
            f"t:{tid}": DomainRule(kv_quota_blocks=6),
            f"t:{both}": DomainRule(floor_blocks=2, kv_quota_blocks=9),
        }
        with sessions() as s:
            store.update_tenant(s, name="capped", kv_quota_blocks=None)
        assert await sync.sync_once() is True
        assert dict(pushed.cache_rules.domains) == {
            f"t:{both}": DomainRule(floor_blocks=2, kv_quota_blocks=9)
        }

    asyncio.run(scenario())
